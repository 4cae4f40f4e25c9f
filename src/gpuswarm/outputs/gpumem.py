"""GPU memory in the outputs (issue 19): the run's measured peaks (summary.json), their line
in the end-of-run print, and the report's section (peaks, OOM retries and their new
reservations, GPUs an ended attempt still held)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from gpuswarm.core.models import Descriptor
from gpuswarm.core.words import counted
from gpuswarm.outputs.energy import Valued
from gpuswarm.outputs.html import esc, html_table

OOM_RETRY_MARK = "the retry reserves"  # supervise/oom.py's sized_oom_retry says it so


class OomRetry(TypedDict):
    """A row of the report's OOM retries, by column (``OOM_COLUMNS``)."""

    task: str
    attempt: int
    peak: int | str  # measured peak MiB ("": not measured)
    reason: str


class PeakStats(TypedDict):
    max: float
    mean: float
    median: float


class GpuMemoryStats(TypedDict, total=False):
    """summary.json's ``gpu_memory`` (``peak_vram_mb`` once a task was measured)."""

    measured: int
    of_total: int
    peak_vram_mb: PeakStats


def gpu_memory_stats(rows: Sequence[Valued]) -> GpuMemoryStats:
    """Measured peak GPU memory over the tasks (issue 19): how many were measured, the peaks'
    max / mean / median (MiB), and the tasks whose reason says an OOM retry was sized."""
    peaks = [
        float(p)
        for r in rows
        if isinstance(p := r.values.get("peak_vram_mb"), int) and not isinstance(p, bool)
    ]
    out: GpuMemoryStats = {"measured": len(peaks), "of_total": len(rows)}
    if peaks:
        out["peak_vram_mb"] = {
            "max": max(peaks),
            "mean": round(statistics.fmean(peaks), 1),
            "median": statistics.median(peaks),
        }
    return out


def gpu_memory_lines(stats: Any) -> list[str]:
    """``peak GPU memory: max 7.9 GiB, median 3.1 GiB (12 of 12 tasks measured)`` (issue 19)."""
    if not isinstance(stats, dict) or not stats.get("measured"):
        return []
    peaks = stats.get("peak_vram_mb") or {}
    try:
        top, mid = float(peaks["max"]) / 1024, float(peaks["median"]) / 1024
    except (KeyError, TypeError, ValueError):
        return []
    return [
        f"peak GPU memory: max {top:.1f} GiB, median {mid:.1f} GiB "
        f"({stats['measured']} of {counted(stats.get('of_total', 0), 'task')} measured)"
    ]


OOM_COLUMNS = {"task": "task", "attempt": "attempt", "peak": "peak MiB", "reason": "reason"}


def oom_retries(task: str, desc: Descriptor) -> list[OomRetry]:
    """The row (by ``OOM_COLUMNS``) of each out-of-memory end retried bigger: the task, the
    attempt, its measured peak MiB ("": not measured), its reason."""
    return [
        {
            "task": task,
            "attempt": a.n,
            "peak": a.peak_vram_mb if a.peak_vram_mb is not None else "",
            "reason": a.reason or "",
        }
        for a in desc.attempts
        if a.oom and OOM_RETRY_MARK in (a.reason or "")
    ]


def gpu_memory_section(
    summary: Mapping[str, Any],
    retries: Sequence[OomRetry],
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
        out.append(html_table(OOM_COLUMNS, retries))
    for gpu, why in sorted(held.items()):
        out.append(f"<p><b>GPU {esc(gpu)} held</b>: {esc(why)}</p>")
    return "\n".join(out) + "\n"
