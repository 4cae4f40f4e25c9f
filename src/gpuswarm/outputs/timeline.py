"""``timeline.png``: a Gantt chart of every attempt of a run, one lane per slot.

Bars are coloured by outcome (done green, failed red, timeout orange, a failed attempt that was
retried pink, interrupted grey); the background stays white, so idle time is what has no bar, and
idle gaps longer than 2% of the span are hatched in light red so they cannot be missed. Each lane
and outcome is one ``broken_barh`` call, so 100k attempts draw in seconds. matplotlib is imported
lazily and used without pyplot (Agg canvas, no global state): importing this module is cheap.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuswarm.core.fsutil import atomic_write_bytes
from gpuswarm.core.models import AttemptRecord, Descriptor, State
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader

COLORS = {
    "done": "#2ca02c",
    "failed": "#d62728",
    "timeout": "#ff8c00",
    "stalled": "#8e44ad",  # issue 34: no activity for stall_after
    "retried": "#f4a6b4",
    "interrupted": "#9e9e9e",
}
GAP_COLOR = "#e53935"
GAP_FRACTION = 0.02  # idle gaps longer than this share of the span are marked
WIDTH_IN = 13.0
DPI = 110


@dataclass(frozen=True)
class Bar:
    lane: str  # slot label, e.g. "gpu0"
    task: str
    start: float  # unix seconds
    end: float
    outcome: str  # "done" | "failed" | "retried" | "timeout" | "interrupted"


def lane_key(lane: str) -> tuple[Any, ...]:
    """Natural order: ``gpu2`` before ``gpu10``, ``gpu0`` before ``gpu0#1``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", lane))


def _outcome(attempt: AttemptRecord, last: bool, state: str) -> str:
    if attempt.interrupted:
        return "interrupted"
    if attempt.kind == "timeout":
        return "timeout"
    if attempt.kind == "stalled":
        return "stalled"
    if not last or state in (State.PENDING.value, State.RUNNING.value):
        return "retried"  # only a failed attempt is followed by another one
    return "done" if state == State.DONE.value else "failed"


def bars_from_descriptor(desc: Descriptor | dict[str, Any], state: str) -> list[Bar]:
    """One bar per attempt of a descriptor that has start and end times (lost ones have none);
    ``desc`` may be its JSON form."""
    if not isinstance(desc, Descriptor):
        desc = Descriptor(desc)
    attempts = desc.attempts
    task = desc.id if desc.has_id else ""
    bars = []
    for i, att in enumerate(attempts):
        if att.started is None or att.ended is None:
            continue
        last = i == len(attempts) - 1
        start, end = float(att.started), float(att.ended)
        outcome = _outcome(att, last, state)
        bars.append(Bar(str(att.slot or "?"), task, start, max(start, end), outcome))
    return bars


def bars_from_queue(queue: DirQueue) -> list[Bar]:
    """Every attempt with a start and an end, from all state folders, in start order."""
    bars: list[Bar] = []
    for state, _, data in RunReader(queue.paths, queue).everything():
        bars += bars_from_descriptor(data, state.value)
    bars.sort(key=lambda b: (b.start, lane_key(b.lane)))
    return bars


def _merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _by_lane(bars: Sequence[Bar], lanes: Iterable[str] = ()) -> dict[str, list[Bar]]:
    found: dict[str, list[Bar]] = {lane: [] for lane in lanes}
    for bar in bars:
        found.setdefault(bar.lane, []).append(bar)
    return {lane: found[lane] for lane in sorted(found, key=lane_key)}


def _gaps(busy: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """The idle stretches of one lane between ``t0`` and ``t1`` (``busy`` merged and sorted)."""
    gaps, at = [], t0
    for start, end in busy:
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    if t1 > at:
        gaps.append((at, t1))
    return gaps


def idle_stats(bars: Sequence[Bar], lanes: Iterable[str] = ()) -> dict[str, float]:
    """Busy share of the lanes (those of ``bars`` plus ``lanes``) from the first start to the last
    end: ``busy_fraction``, ``idle_seconds`` (summed over lanes) and ``span_seconds``."""
    if not bars:
        return {"busy_fraction": 0.0, "idle_seconds": 0.0, "span_seconds": 0.0}
    t0, t1 = min(b.start for b in bars), max(b.end for b in bars)
    groups = _by_lane(bars, lanes)
    busy = sum(
        e - s for group in groups.values() for s, e in _merged((b.start, b.end) for b in group)
    )
    capacity = (t1 - t0) * len(groups)
    return {
        "busy_fraction": busy / capacity if capacity > 0 else 1.0,
        "idle_seconds": max(0.0, capacity - busy),
        "span_seconds": t1 - t0,
    }


def _spans(
    group: Sequence[Bar], t0: float, scale: float, pixel: float
) -> dict[str, list[tuple[float, float]]]:
    """(x, width) per outcome. A bar whose next one starts less than a pixel later is drawn up
    to it: such slivers cannot be shown, and as white hairlines they would make a busy lane look
    idle. The busy fraction is still computed from the real times."""
    ordered = sorted(group, key=lambda b: b.start)
    out: dict[str, list[tuple[float, float]]] = {}
    for i, bar in enumerate(ordered):
        end = bar.end
        if i + 1 < len(ordered) and 0 < ordered[i + 1].start - end < pixel:
            end = ordered[i + 1].start
        out.setdefault(bar.outcome, []).append(
            ((bar.start - t0) / scale, (end - bar.start) / scale)
        )
    return out


def _unit(span: float) -> tuple[float, str]:
    if span >= 3 * 3600:
        return 3600.0, "hours"
    if span >= 600:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _esc(text: str) -> str:
    return " ".join(text.split()).replace("$", r"\$")


def timeline_png(
    bars: Sequence[Bar],
    path: Path,
    *,
    title: str = "",
    lanes: Iterable[str] = (),
    marks: Mapping[str, str] | None = None,
) -> Path:
    """Render the Gantt chart of ``bars`` (plus empty ``lanes``) to ``path`` atomically;
    ``marks`` (lane -> text, e.g. "quarantined") are shown in red next to the lane's name."""
    marks = marks or {}
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    groups = _by_lane(bars, lanes)
    height = min(40.0, max(3.0, 1.6 + 0.32 * len(groups)))
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_facecolor("white")
    prefix = f"{_esc(title)}: " if title else ""
    if not bars:
        ax.text(0.5, 0.5, "no attempts", transform=ax.transAxes, ha="center", va="center")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(prefix + "no attempts yet", fontsize=12)
        return _save(fig, Path(path))
    stats = idle_stats(bars, lanes)
    t0 = min(b.start for b in bars)
    span = stats["span_seconds"]
    scale, unit = _unit(span)
    min_gap = GAP_FRACTION * span
    few = len(bars) <= 400  # few bars: white edges tell them apart; many must stay solid, with
    edge = 0.6 if few else 0.0  # no antialiasing seams that would look like idle slivers
    gap_count = 0
    pixel = span / (WIDTH_IN * DPI) if span > 0 else 0.0
    for y, group in enumerate(groups.values()):
        for outcome, spans in _spans(group, t0, scale, pixel).items():
            ax.broken_barh(
                spans,
                (y - 0.4, 0.8),
                facecolors=COLORS[outcome],
                edgecolors="white",
                linewidths=edge,
                antialiaseds=few,
            )
        busy = _merged((b.start, b.end) for b in group)
        gaps = [(s, e) for s, e in _gaps(busy, t0, t0 + span) if e - s > min_gap]
        if gaps:
            gap_count += len(gaps)
            rects = [((s - t0) / scale, (e - s) / scale) for s, e in gaps]
            ax.broken_barh(
                rects,
                (y - 0.4, 0.8),
                facecolors="none",
                edgecolors="#f2b8b5",
                hatch="///",
                linewidths=0,
            )
            ax.hlines(
                [y] * len(rects),
                [x for x, _ in rects],
                [x + w for x, w in rects],
                colors=GAP_COLOR,
                linewidths=1.0,
            )
    names = [_esc(lane) + (f" ({_esc(marks[lane])})" if lane in marks else "") for lane in groups]
    ax.set_yticks(range(len(groups)), names, fontsize=9 if len(groups) <= 32 else 6)
    for tick, lane in zip(ax.get_yticklabels(), groups, strict=True):
        if lane in marks:
            tick.set_color("#d62728")
    ax.set_ylim(len(groups) - 0.5, -0.5)  # first lane on top
    ax.set_xlim(0, span / scale if span > 0 else 1)
    ax.set_xlabel(f"{unit} since the first start")
    ax.grid(True, axis="x", color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)
    counts = {o: sum(1 for b in bars if b.outcome == o) for o in COLORS}
    handles = [
        Patch(facecolor=c, label=f"{o} ({counts[o]})") for o, c in COLORS.items() if counts[o]
    ]
    handles.append(
        Patch(
            facecolor="white",
            edgecolor=GAP_COLOR,
            hatch="///",
            label=f"idle gap > {GAP_FRACTION:.0%} of span ({gap_count})",
        )
    )
    fig.legend(
        handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9, frameon=False
    )
    busy_pct = 100 * stats["busy_fraction"]
    ax.set_title(
        f"{prefix}GPU busy {busy_pct:.1f}%  ·  {len(bars)} attempts on {len(groups)} lanes  ·  "
        f"span {span / scale:.3g} {unit}, idle {stats['idle_seconds'] / scale:.3g} lane-{unit}",
        fontsize=12,
    )
    return _save(fig, Path(path))


def _save(fig: Any, path: Path) -> Path:
    """PNG bytes written atomically (temp with pid + thread id in the same folder, fsync)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    atomic_write_bytes(path, buf.getvalue())
    return path
