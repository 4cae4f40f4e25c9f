"""The report's GPU memory section (issue 19): measured peaks, OOM retries and their new
reservations, GPUs an ended attempt still held."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuswarm.core.models import Descriptor
from gpuswarm.outputs.html import esc, html_table

OOM_RETRY_MARK = "the retry reserves"  # supervise/packing.py's sized_oom_retry says it so


def oom_retries(task: str, desc: Descriptor) -> list[tuple[str, int, Any, str]]:
    """(task, attempt, measured peak MiB, reason) of each out-of-memory end retried bigger."""
    return [
        (task, a.n, a.peak_vram_mb if a.peak_vram_mb is not None else "", a.reason or "")
        for a in desc.attempts
        if a.oom and OOM_RETRY_MARK in (a.reason or "")
    ]


def gpu_memory_section(
    summary: Mapping[str, Any],
    retries: Sequence[tuple[str, int, Any, str]],
    held: Mapping[int, str],
) -> str:
    """Empty when nothing was measured, retried or held (runs without a GPU query)."""
    stats = summary.get("gpu_memory") or {}
    measured = int(stats.get("measured") or 0)
    if not measured and not retries and not held:
        return ""
    out = ["<h2>GPU memory</h2>"]
    peaks = stats.get("peak_vram_mb") or {}
    if measured:
        out.append(
            f"<p>peak GPU memory measured for {measured} of {esc(stats.get('of_total'))} tasks "
            f"(MiB): max {esc(peaks.get('max'))}, mean {esc(peaks.get('mean'))}, median "
            f"{esc(peaks.get('median'))}</p>"
        )
    if retries:
        out.append(f"<h3>CUDA out-of-memory retries ({len(retries)})</h3>")
        out.append(html_table(("task", "attempt", "peak MiB", "reason"), list(retries)))
    for gpu, why in sorted(held.items()):
        out.append(f"<p><b>GPU {esc(gpu)} held</b>: {esc(why)}</p>")
    return "\n".join(out) + "\n"
