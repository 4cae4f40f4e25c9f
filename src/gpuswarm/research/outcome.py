"""What a variant's ended task produced, as the experiment records it: ok or the crash reason
(OOM, timeout, the failing line of the log, FAIL, no metric, a changed protected file), the
metric, peak memory, the log's summary block and where it ran."""

from __future__ import annotations

import contextlib
import re
import socket
from pathlib import Path
from typing import Any

from gpuswarm.app import api
from gpuswarm.core.logs import log_tail
from gpuswarm.research import progress
from gpuswarm.research.entries import FinishedEntry
from gpuswarm.research.executor import run_paths
from gpuswarm.research.experiment import MEMORY_METRIC, ExperimentConfig, ExpPaths
from gpuswarm.research.exports import protected_changes, protected_data_changes
from gpuswarm.research.journal import Variant

SUMMARY_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*):\s+([-+]?[0-9.]+(?:[eE][-+]?\d+)?)\s*$")


def summary_fields(log: Path, max_bytes: int = 65536) -> dict[str, float]:
    """``key: number`` lines of the log's tail (the training script's summary block)."""
    text = log_tail(log, max_lines=400, max_bytes=max_bytes)
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = SUMMARY_LINE.match(line)
        if m:
            with contextlib.suppress(ValueError):
                out[m.group(1)] = float(m.group(2))
    return out


def outcome(
    paths: ExpPaths, cfg: ExperimentConfig, v: Variant, found: api.TaskRef
) -> FinishedEntry | None:
    """What a variant's task (``found`` by ``executor.tasks``) produced; None while unfinished."""
    last = api.last_attempt(run_paths(paths, cfg), found)
    if last is None:
        return None
    log = last.log
    metric = last.metrics.get(cfg.metric)
    text = log_tail(log, max_lines=400, max_bytes=1 << 20) if log else ""
    reason = _crash_reason(cfg, last, metric, text)
    protect = protected_changes(paths, cfg, v) + protected_data_changes(paths, cfg)
    if reason is None and protect:
        reason = f"changed protected file {', '.join(protect)}"
    return {
        "ok": reason is None,
        "metric": float(metric) if reason is None and metric is not None else None,
        "memory_gb": memory_gb(last.metrics.get(MEMORY_METRIC), getattr(last, MEMORY_METRIC)),
        "reason": reason,
        "summary": summary_fields(log) if log else {},
        "gpu": ",".join(str(g) for g in last.gpus),
        "slot": last.slot,
        "host": last.host or socket.gethostname(),
        "accelerator": last.accelerator,
        "started": last.started,
        "ended": last.ended,
        "seconds": last.duration,
        "exit": last.returncode,
        "log": str(log.relative_to(paths.root)) if log else None,
        "log_path": str(log.resolve()) if log else None,
        "tail": "\n".join(text.splitlines()[-15:]) if reason else "",
        "energy_j": last.energy_j,  # issue 37
        "energy_mode": last.energy_mode,
        # issue 38: its progress curve (bounded), what pruning compares runs with
        "curve": progress.read_curve(log, cfg.progress_pattern) if log else [],
    }


def memory_gb(printed: Any, measured: int | None) -> float | None:
    """GiB of GPU memory for the results row: what the script printed (``MEMORY_METRIC``), else
    what gpuswarm's VRAM sampler measured (issue 19), else None (not measured)."""
    if isinstance(printed, bool) or not isinstance(printed, int | float):
        printed = measured
    return round(float(printed) / 1024, 1) if isinstance(printed, int | float) else None


def _crash_reason(cfg: ExperimentConfig, last: api.Attempt, metric: Any, text: str) -> str | None:
    if last.oom:
        return "OOM"
    if last.kind == "timeout":
        return f"timeout after {cfg.timeout:g}s"
    if last.state is api.TaskState.CANCELLED:  # `gpuswarm cancel` of the run's task
        return str(last.reason or "cancelled")
    if last.state is api.TaskState.FAILED:
        reason = str(last.reason or "failed")
        line = failing_line(text)
        if not line and "SIGKILL" in reason:
            line = "killed from outside, e.g. by the kernel when memory ran out"
        return f"{reason}: {line}" if line else reason
    if re.search(cfg.fail_pattern, text, re.MULTILINE):
        return "FAIL"
    if not isinstance(metric, int | float) or metric != metric:  # missing or NaN
        return f"no {cfg.metric} in the output"
    return None


_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b.*$"
    r"|^Killed\b.*$|^Segmentation fault.*$|^.*(?:[Oo]ut of memory|CUDA error).*$"
)


def failing_line(text: str, limit: int = 160) -> str:
    """The line of a crashed run's log that says why: its last exception line
    (``SyntaxError: invalid syntax``, ``MemoryError``), a kill or an out-of-memory message."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and _EXCEPTION_LINE.match(line):
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""
