"""progress_png: charts for realistic, empty, tiny, crash-only and goal-max sequences."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from PIL import Image

from gpuswarm.research import plot
from gpuswarm.research.plot import PlotRow, progress_png

SIZE = (round(plot.FIGSIZE[0] * plot.DPI), round(plot.FIGSIZE[1] * plot.DPI))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def realistic(n: int = 30, seed: int = 7) -> list[PlotRow]:
    """A baseline keep, then ``n`` rows: improvements kept, the rest discarded, a few crashes and
    one diverged run far off the scale."""
    rnd = random.Random(seed)
    rows, best = [PlotRow(1.0123, "keep", "baseline")], 1.0123
    for i in range(n):
        if i in (4, 17, 25):
            rows.append(PlotRow(None, "crash", "OOM at batch 512"))
        elif i == 10:
            rows.append(PlotRow(3.9, "discard", "lr 1.0: diverged"))
        else:
            v = best + rnd.gauss(0.004, 0.006)
            desc = f"idea {i}: tweak the $lr schedule and the  warmup " + "x" * rnd.randint(0, 40)
            rows.append(PlotRow(v, "keep" if v < best else "discard", desc))
            best = min(best, v)
    return rows


def load(path: Path) -> NDArray[np.int_]:
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size == SIZE
        return np.asarray(im.convert("RGB")).astype(int)


def count(img: NDArray[np.int_], color: str, tol: int) -> int:
    rgb = np.array([int(color[k : k + 2], 16) for k in (1, 3, 5)])
    return int((np.abs(img - rgb).max(axis=2) <= tol).sum())


def green(img: NDArray[np.int_]) -> int:
    return count(img, plot.KEEP_COLOR, 20)


def grey(img: NDArray[np.int_]) -> int:
    return count(img, plot.DISCARD_COLOR, 3)  # tight: antialiased black text has few such pixels


def red(img: NDArray[np.int_]) -> int:
    return count(img, plot.CRASH_COLOR, 25)


def no_temp_files(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if ".tmp-" in p.name]


def test_realistic_chart(tmp_path: Path) -> None:
    rows = realistic()
    assert {r.status for r in rows} == {"keep", "discard", "crash"}
    out = tmp_path / "progress.png"
    assert progress_png(rows, out, metric="val_bpb", title="nanochat") == out
    img = load(out)
    assert green(img) > 300
    assert grey(img) > 500
    assert red(img) > 50
    assert no_temp_files(tmp_path)
    # without the discards far fewer grey pixels: those were the dots, not text
    only_kept = [r for r in rows if r.status != "discard"]
    img2 = load(progress_png(only_kept, tmp_path / "kept.png", metric="val_bpb"))
    assert grey(img2) * 2 < grey(img)


def test_outlier_does_not_flatten_the_chart() -> None:
    rows = realistic()
    kept = [r.metric for r in rows if r.status == "keep" and r.metric is not None]
    disc = [r.metric for r in rows if r.status == "discard" and r.metric is not None]
    lo, hi = plot._ylimits(kept, disc, "min")
    assert lo < min(kept) and max(kept) < hi
    assert hi < 1.2  # the 3.9 outlier is drawn on the edge instead
    assert sum(lo <= v <= hi for v in disc) >= len(disc) - 3


def test_no_experiments(tmp_path: Path) -> None:
    img = load(progress_png([], tmp_path / "p.png", metric="val_bpb"))
    assert green(img) == 0
    assert red(img) == 0
    assert no_temp_files(tmp_path)


def test_one_experiment(tmp_path: Path) -> None:
    img = load(progress_png([PlotRow(0.99, "keep", "baseline")], tmp_path / "p.png", metric="m"))
    assert green(img) > 50
    assert red(img) == 0


def test_only_crashes(tmp_path: Path) -> None:
    rows = [PlotRow(None, "crash", f"crash {i}") for i in range(3)]
    img = load(progress_png(rows, tmp_path / "p.png", metric="val_bpb"))
    assert red(img) > 50
    assert green(img) == 0


def test_goal_max(tmp_path: Path) -> None:
    rows = [
        PlotRow(None if r.metric is None else 2 - r.metric, r.status, r.description)
        for r in realistic(seed=3)
    ]
    img = load(progress_png(rows, tmp_path / "p.png", metric="accuracy", goal="max"))
    assert green(img) > 300
    assert grey(img) > 500
    assert red(img) > 50


def test_discards_without_keeps_and_nonfinite(tmp_path: Path) -> None:
    rows = [
        PlotRow(1.5, "discard", "a"),
        PlotRow(float("nan"), "discard", "b"),
        PlotRow(1.4, "discard", "c"),
    ]
    img = load(progress_png(rows, tmp_path / "p.png", metric="loss"))
    assert green(img) == 0
    assert red(img) > 10  # the nan row is drawn as a crash


def test_overwrite_replaces_file(tmp_path: Path) -> None:
    out = tmp_path / "progress.png"
    out.write_bytes(b"old garbage")
    old_inode = out.stat().st_ino
    progress_png(realistic(), out, metric="val_bpb")
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert out.stat().st_ino != old_inode  # replaced by rename, not rewritten in place
    load(out)
    assert no_temp_files(tmp_path)


def test_failed_replace_leaves_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "progress.png"
    out.write_bytes(b"old")

    def boom(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        progress_png(realistic(5), out, metric="val_bpb")
    assert out.read_bytes() == b"old"
    assert no_temp_files(tmp_path)


def test_bad_goal(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="goal"):
        progress_png([], tmp_path / "p.png", metric="m", goal="lowest")


def test_import_is_lazy() -> None:
    code = "import sys, gpuswarm.research.plot; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_title_shows_bases_metric_not_a_lucky_repeat() -> None:
    """After ``baseline --repeat 3`` BASE's metric is the mean; the title must say that, as the
    report header does, not the luckiest of the repeats (issue 13 item 10)."""
    from matplotlib.figure import Figure

    rows = [PlotRow(1.0, "keep", "baseline"), PlotRow(0.9, "keep", "baseline (repeat 2/3)")]
    rows.append(PlotRow(1.1, "keep", "baseline (repeat 3/3)"))
    ax = Figure().add_subplot()
    assert "best val_bpb 1.000000" in plot._draw(ax, rows, "val_bpb", "min", 1.0)
    assert "best val_bpb 0.900000" in plot._draw(Figure().add_subplot(), rows, "val_bpb", "min")


def test_a_rebased_discard_is_marked_as_such() -> None:
    """A stale-parent winner (better than the running best, discarded and measured again as a
    combination) has its own marker and legend entry, not a plain grey discard."""
    from matplotlib.figure import Figure

    rows = [PlotRow(1.0, "keep", "baseline"), PlotRow(0.95, "keep", "lr 0.05")]
    rows += [PlotRow(0.9, "discard", "depth 6 (re-based, see v0004)"), PlotRow(1.2, "discard", "x")]
    ax = Figure().add_subplot()
    plot._draw(ax, rows, "val_bpb", "min")
    labels = ax.get_legend_handles_labels()[1]
    assert "re-based, measured again (1)" in labels and "discarded (1)" in labels, labels


def test_labels_of_consecutive_keeps_do_not_overlap() -> None:
    """Forty keeps in a row: the labels that are shown never overlap (the newest win)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [PlotRow(1.0 - i * 0.001, "keep", f"idea {i}: a longer description") for i in range(40)]
    fig = Figure(figsize=plot.FIGSIZE, dpi=plot.DPI)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    plot._draw(ax, rows, "val_bpb", "min")
    renderer = canvas.get_renderer()  # type: ignore[no-untyped-call]
    texts = [t for t in ax.texts if t.get_text().startswith("idea")]
    shown = [t.get_window_extent(renderer) for t in texts if t.get_visible()]
    assert len(texts) == 40 and 3 <= len(shown) < 40
    assert not any(a.overlaps(b) for i, a in enumerate(shown) for b in shown[i + 1 :])
    assert texts[-1].get_visible()  # the latest (best) one is always labelled
