"""``progress.png`` of a research loop, in the style of autoresearch's progress chart.

x is the experiment number (1..N, in order), y the metric. Discarded experiments are small grey
dots, kept ones larger green dots labelled with their (shortened) description, the running best
a green step line, crashes red crosses on the bottom edge. The y-range follows the kept values and
the bulk of the discards, so one terrible outlier does not flatten the chart: values beyond it
are drawn as triangles on the edge. matplotlib is imported lazily and used without pyplot (Agg
canvas, no global state), so this is thread-safe and needs no display.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes

KEEP_COLOR = "#2ca02c"
DISCARD_COLOR = "#bbbbbb"
CRASH_COLOR = "#d62728"
PRUNED_COLOR = "#ff7f0e"  # issue 38: stopped early by the loop's pruning
DARK_GREEN = "#1b5e20"
FIGSIZE = (12.0, 6.0)
DPI = 120
LABEL_CHARS = 40
REBASED = "(re-based, see v"  # results.tsv marks a stale-parent winner so


@dataclass(frozen=True)
class PlotRow:
    metric: float | None  # None for crashes
    status: str  # "keep" | "discard" | "crash"
    description: str
    base: float | None = None  # BASE's metric once this row was decided (a keep's mean)
    change: bool = True  # a change (variant, combo), not a baseline run or a re-run


def _esc(text: str) -> str:
    """Plain text for matplotlib: no mathtext from ``$``, whitespace collapsed."""
    return " ".join(text.split()).replace("$", r"\$")


def _short(text: str) -> str:
    text = " ".join(text.split())
    return _esc(text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1].rstrip() + "…")


def _has_metric(row: PlotRow) -> bool:
    return (
        row.status not in ("crash", "pruned")
        and row.metric is not None
        and math.isfinite(row.metric)
    )


def _ylimits(kept: list[float], discarded: list[float], goal: str) -> tuple[float, float]:
    """Limits around the kept values and the median discard, widened to the nearby discards."""
    core = kept + ([statistics.median(discarded)] if discarded else [])
    lo, hi = min(core), max(core)
    iqr = 0.0
    if len(discarded) >= 2:
        q = statistics.quantiles(discarded, n=4)
        iqr = q[2] - q[0]
    floor = max(1e-2 * max(abs(lo), abs(hi)), 1e-9)
    spread = max(hi - lo, iqr, floor)
    near = [v for v in discarded if lo - spread <= v <= hi + spread]
    lo, hi = min([lo, *near]), max([hi, *near])
    if hi - lo < floor:
        lo, hi = (lo + hi - floor) / 2, (lo + hi + floor) / 2
    pad = (hi - lo) * 0.08
    # room for the crash row below, and above for the labels (the best ones are on top for max)
    return lo - pad * 1.6, hi + pad * (4.0 if goal == "max" else 2.5)


def running_best(rows: Sequence[PlotRow], goal: str) -> tuple[list[int], list[float]]:
    """The running best's steps (experiment numbers, values): BASE's metric after each kept
    row where the ledger has it (a keep confirmed by re-runs: their mean, never the luckiest
    run), else the best kept run so far."""
    better = min if goal == "min" else max
    xs: list[int] = []
    ys: list[float] = []
    for i, r in enumerate(rows, 1):
        if not (_has_metric(r) and r.status == "keep") or (r.base is None and not r.change):
            continue  # a control or confirmation re-run says nothing new of BASE's metric
        assert r.metric is not None
        value = r.base if r.base is not None else r.metric
        if r.base is None and ys:
            value = better(ys[-1], value)
        xs.append(i)
        ys.append(value)
    return xs, ys


def summary_line(
    rows: Sequence[PlotRow], metric: str, goal: str, best_value: float | None = None
) -> str:
    """The chart's title: experiments, changes kept, BASE's best, crashes (research/figures.py
    defines each as every other view does)."""
    n = len(rows)
    changes = sum(1 for r in rows if _has_metric(r) and r.status == "keep" and r.change)
    out = f"{n} experiment{'s' if n != 1 else ''}, {changes} kept"
    _, ys = running_best(rows, goal)
    if ys:
        out += f", best {_esc(metric)} {ys[-1] if best_value is None else best_value:.6f}"
    crashed = sum(1 for r in rows if not _has_metric(r) and r.status != "pruned")
    pruned = sum(1 for r in rows if r.status == "pruned")
    out += f", {pruned} pruned" if pruned else ""
    return out + (f", {crashed} crashed" if crashed else "")


def _draw(
    ax: Axes, rows: Sequence[PlotRow], metric: str, goal: str, best_value: float | None = None
) -> str:
    """Draw the experiments on ``ax``; return the title's summary."""
    n = len(rows)
    xs_keep = [i for i, r in enumerate(rows, 1) if _has_metric(r) and r.status == "keep"]
    xs_disc = [i for i, r in enumerate(rows, 1) if _has_metric(r) and r.status != "keep"]
    xs_crash = [i for i, r in enumerate(rows, 1) if not _has_metric(r) and r.status != "pruned"]
    xs_pruned = [i for i, r in enumerate(rows, 1) if r.status == "pruned"]
    val = {i: float(r.metric) for i, r in enumerate(rows, 1) if r.metric is not None}
    kept, disc = [val[i] for i in xs_keep], [val[i] for i in xs_disc]
    ax.set_xlim(0.3, n + 1 + 0.12 * n)  # room for the last labels (set first: labels are laid
    # out against it)
    if kept or disc:
        ymin, ymax = _ylimits(kept, disc, goal)
        ax.set_ylim(ymin, ymax)
        ax.ticklabel_format(axis="y", useOffset=False)
    else:
        ax.set_yticks([])  # nothing but crashes: no scale to show
    if disc:
        inside = [i for i in xs_disc if ymin <= val[i] <= ymax]
        rebased = [i for i in inside if REBASED in rows[i - 1].description]
        inside = [i for i in inside if i not in rebased]
        label = f"discarded ({len(xs_disc) - len(rebased)})"
        ax.scatter(inside, [val[i] for i in inside], s=18, c=DISCARD_COLOR, zorder=2, label=label)
        if rebased:  # a winner measured on an older BASE: measured again as a combination
            ax.scatter(
                rebased,
                [val[i] for i in rebased],
                s=30,
                facecolors="none",
                edgecolors=KEEP_COLOR,
                zorder=2,
                label=f"re-based, measured again ({len(rebased)})",
            )
        for i in (i for i in xs_disc if i not in inside):  # outliers: a triangle on the edge
            up = val[i] > ymax
            y = ymax - (ymax - ymin) * 0.015 if up else ymin + (ymax - ymin) * 0.015
            ax.scatter([i], [y], s=30, c=DISCARD_COLOR, marker="^" if up else "v", zorder=2)
            ax.annotate(f"{val[i]:.4g}", (i, y), (5, -3), "data", "offset points", fontsize=6)
    if kept:
        xs_best, best = running_best(rows, goal)
        xs, ys = [*xs_best, n], [*best, best[-1]]
        (step,) = ax.plot(xs, ys, c=KEEP_COLOR, lw=1.6, alpha=0.8, drawstyle="steps-post", zorder=3)
        step.set_label("running best")
        changes = [i for i in xs_keep if rows[i - 1].change]
        runs_of_base = [i for i in xs_keep if not rows[i - 1].change]
        if runs_of_base:  # baselines, controls, confirmations: BASE measured, nothing kept
            base_dots = ax.scatter(
                runs_of_base, [val[i] for i in runs_of_base], s=22, facecolors="none",
                edgecolors=DARK_GREEN, lw=0.8, zorder=4,
            )  # fmt: skip
            base_dots.set_label(f"runs of BASE ({len(runs_of_base)})")
        dots = ax.scatter(
            changes, [val[i] for i in changes], s=55, c=KEEP_COLOR, edgecolors=DARK_GREEN,
            lw=0.6, zorder=4,
        )  # fmt: skip
        dots.set_label(f"kept ({len(changes)})")
        labels = []
        for i in changes:  # the description, shortened, up and to the right of the dot
            desc, xy, off = _short(rows[i - 1].description), (i, val[i]), (4.0, 5.0)
            text = ax.annotate(desc, xy, off, textcoords="offset points", rotation=25, fontsize=7)
            text.set(rotation_mode="anchor", color=DARK_GREEN, clip_on=True)
            labels.append(text)
        _drop_overlapping(ax, labels)
    if xs_crash:
        ys = [0.02] * len(xs_crash)  # axes fraction: on the bottom edge, they have no metric
        tr = ax.get_xaxis_transform()
        marks = ax.scatter(xs_crash, ys, s=30, c=CRASH_COLOR, marker="x", lw=1.5, transform=tr)
        marks.set(clip_on=False, zorder=4, label=f"crash ({len(xs_crash)})")
    if xs_pruned:  # issue 38: stopped early, no final metric: a mark on the bottom edge
        tr = ax.get_xaxis_transform()
        ys = [0.05] * len(xs_pruned)
        marks = ax.scatter(xs_pruned, ys, s=26, c=PRUNED_COLOR, marker="v", transform=tr)
        marks.set(clip_on=False, zorder=4, label=f"pruned ({len(xs_pruned)})")
    return summary_line(rows, metric, goal, best_value)


def _drop_overlapping(ax: Axes, labels: list[Any]) -> None:
    """Hide labels that would overlap one already shown; the latest keeps (the best so far)
    are shown first, so a run of consecutive keeps reads as the newest ones."""
    canvas = ax.figure.canvas
    renderer = canvas.get_renderer() if hasattr(canvas, "get_renderer") else None
    if renderer is None:  # pragma: no cover - every Figure here has an Agg canvas
        return
    shown: list[Any] = []
    for text in reversed(labels):
        box = text.get_window_extent(renderer)
        if any(box.overlaps(other) for other in shown):
            text.set_visible(False)
        else:
            shown.append(box)


def progress_png(
    rows: Sequence[PlotRow],
    path: Path,
    *,
    metric: str,
    goal: str = "min",
    title: str = "autoresearch",
    best: float | None = None,
) -> Path:
    """Render the progress chart of ``rows`` to ``path`` (PNG, written atomically); return it."""
    if goal not in ("min", "max"):
        raise ValueError(f"goal must be 'min' or 'max', not {goal!r}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    fig.subplots_adjust(left=0.07, right=0.98, top=0.92, bottom=0.09)
    ax.set_xlabel("experiment #")
    ax.set_ylabel(_esc(metric) + (" (lower is better)" if goal == "min" else " (higher is better)"))
    ax.grid(True, color="#e6e6e6", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if rows:
        summary = _draw(ax, rows, metric, goal, best)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(
                loc="upper right" if goal == "min" else "upper left", fontsize=8, framealpha=0.9
            )
    else:
        summary = "no experiments yet"
        ax.text(0.5, 0.5, summary, transform=ax.transAxes, ha="center", va="center", fontsize=14)
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_title(f"{_esc(title)}: {summary}", fontsize=12)

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            fig.savefig(f, format="png", dpi=DPI)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
