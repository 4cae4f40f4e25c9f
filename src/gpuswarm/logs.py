"""Reading attempt logs: tails for messages and status, out-of-memory detection."""

from __future__ import annotations

import os
import re
from pathlib import Path

_OOM_SCAN_BYTES = 65536
_OOM_MARKERS = (
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "HIP out of memory",
    "hipErrorOutOfMemory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
)
_GPU_WORD = re.compile(r"\b(cuda|hip|gpu)\b", re.IGNORECASE)


def _read_tail(path: Path, max_bytes: int) -> tuple[bytes, bool]:
    """The last ``max_bytes`` of a file, and whether the start was cut off."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            fh.seek(start)
            return fh.read(max_bytes), start > 0
    except OSError:
        return b"", False


def _last_state(line: str) -> str:
    parts = [p for p in line.split("\r") if p]
    return parts[-1] if parts else ""


def log_tail(path: Path, max_lines: int = 20, max_bytes: int = 16384) -> str:
    """The last lines of a log; ``\\r``-rewritten progress lines keep only their last state."""
    data, cut = _read_tail(path, max_bytes)
    lines = data.decode("utf-8", errors="replace").split("\n")
    if cut and len(lines) > 1:
        lines = lines[1:]  # a partial first line
    if lines and lines[-1] == "":
        lines.pop()
    lines = [_last_state(line) for line in lines]
    return "\n".join(lines[-max_lines:]) if max_lines > 0 else ""


def detect_oom(path: Path) -> bool:
    """Whether the last 64 KiB of a log show a GPU out-of-memory error."""
    text = _read_tail(path, _OOM_SCAN_BYTES)[0].decode("utf-8", errors="replace")
    if any(marker in text for marker in _OOM_MARKERS):
        return True
    if "out of memory" not in text.lower():
        return False
    return any(
        "out of memory" in line.lower() and _GPU_WORD.search(line) for line in text.splitlines()
    )


CUT_MARKER = b"\n[gpuswarm: %d bytes of output dropped here to keep the log under %d bytes]\n"


def cap_log(path: Path, limit: int) -> int:
    """Keep a growing log under ``limit`` bytes: its head, a marker, and its latest output.

    The task writes with O_APPEND, so after the truncation its next writes land after the kept
    tail. Returns the bytes dropped (0 when the log is within the limit).
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size <= limit:
        return 0
    keep = max(1, limit // 4)
    with path.open("r+b") as fh:
        fh.seek(size - keep)
        tail = fh.read(keep)
        fh.truncate(keep)
        fh.seek(keep)
        dropped = size - 2 * keep
        fh.write(CUT_MARKER % (dropped, limit) + tail)
    return dropped
