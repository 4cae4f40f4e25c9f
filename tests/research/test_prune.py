"""Issue 38: the pruning rule on synthetic curves, and bounded parsing of progress lines."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import progress, prune
from gpuswarm.research.entries import FinishedEntry
from gpuswarm.research.journal import ExperimentState, Variant

TIMES = [i * 1.0 for i in range(1, 11)]  # ten points over a 10 s budget
JITTER = (0.0, 0.02, -0.02, 0.01)  # BASE's runs differ by this much (sd about 0.017)


def base_curve(offset: float) -> progress.Curve:
    return [[t, 3.0 - 0.1 * t + offset] for t in TIMES]


def reference(runs: int = 4) -> prune.Reference:
    curves = [base_curve(j) for j in JITTER[:runs]]
    return prune.Reference(curves=curves, groups=[curves], budget=10.0, full_seconds=12.0)


def first_stop(opts: prune.PruneOptions, curve: progress.Curve) -> prune.Verdict | None:
    """The verdict the loop would reach, looking at the curve as it grows point by point."""
    for i in range(len(curve)):
        verdict = prune.judge(opts, reference(), curve[: i + 1], "min")
        if verdict is not None:
            return verdict
    return None


@pytest.mark.parametrize("rule", ["median", "curve"])
def test_worse_early_better_late_within_the_grace_is_not_pruned(rule: str) -> None:
    # far worse than BASE for the first 20% of the budget (the grace), better from then on
    curve = [[t, 3.0 - 0.1 * t + (1.0 if t < 2.0 else -0.05)] for t in TIMES]
    assert first_stop(prune.PruneOptions(rule, grace=0.2, k=3), curve) is None
    # without the grace the same run would have been stopped at its first point
    stopped = first_stop(prune.PruneOptions("median", grace=0.0, k=3), curve)
    assert stopped is not None and stopped.t == 1.0


@pytest.mark.parametrize("rule", ["median", "curve"])
def test_curves_inside_the_noise_prune_nothing(rule: str) -> None:
    opts = prune.PruneOptions(rule, grace=0.2, k=3)
    for offset in (0.03, 0.045, -0.2, 0.0):  # within k x sd (3 x 0.017) of BASE, or better
        assert first_stop(opts, base_curve(offset)) is None, offset


@pytest.mark.parametrize("rule", ["median", "curve"])
def test_a_clear_loser_is_pruned_after_the_grace(rule: str) -> None:
    verdict = first_stop(prune.PruneOptions(rule, grace=0.2, k=3), base_curve(0.5))
    assert verdict is not None
    assert verdict.t == (2.0 if rule == "median" else 3.0)  # curve: two points beyond the band
    assert verdict.value - verdict.ref == pytest.approx(0.5 - 0.0075, abs=0.01)
    assert verdict.text("val_bpb", 3).startswith(f"pruned at {verdict.t:g}s of 10s: val_bpb 3.")


@pytest.mark.parametrize("rule", ["median", "curve"])
def test_a_loser_seen_only_near_the_end_runs_to_its_end(rule: str) -> None:
    # inside the noise until 90% of the budget, then clearly worse: stopping it at its last
    # points would save under a tenth of the run and lose its metric (run 7 in BENCHMARKS.md)
    curve = [[t, v + (0.5 if t >= 9.0 else 0.0)] for t, v in base_curve(0.0)]
    assert first_stop(prune.PruneOptions(rule, grace=0.2, k=3), curve) is None
    # the same gap just before that point still stops it
    early = [[t, v + (0.5 if t >= 8.0 else 0.0)] for t, v in base_curve(0.0)]
    assert first_stop(prune.PruneOptions("median", grace=0.2, k=3), early) is not None


def test_goal_max_prunes_the_low_ones() -> None:
    ref = prune.Reference([base_curve(j) for j in JITTER], [[base_curve(j) for j in JITTER]], 10, 1)
    low = [[t, v - 0.5] for t, v in base_curve(0.0)]
    opts = prune.PruneOptions("median", 0.2, 3)
    assert prune.judge(opts, ref, low[:5], "max") is not None
    assert prune.judge(opts, ref, low[:5], "min") is None  # lower is better for min


def test_too_few_runs_of_identical_code_never_prune() -> None:
    curves = [base_curve(0.0), base_curve(0.02)]  # two runs: one degree of freedom
    ref = prune.Reference(curves, [curves], 10.0, 12.0)
    assert prune.noise_at(ref, 5.0) is None
    assert prune.judge(prune.PruneOptions("median", 0.2, 3), ref, base_curve(2.0), "min") is None


def _run(vid: str, commit: str, curve: progress.Curve, kind: str = "control") -> Variant:
    fin: FinishedEntry = {"ok": True, "metric": curve[-1][1], "curve": curve, "seconds": 12.0}
    return Variant(vid, kind, commit, "b", "x", 1, "s", 0.0, finished=fin)


def test_waiting_reason_says_why_until_the_noise_is_measured() -> None:
    state = ExperimentState(base="b")
    state.variants["v0001"] = _run("v0001", "b", base_curve(0.0), "baseline")
    state.variants["v0002"] = _run("v0002", "b", base_curve(0.02), "baseline")
    why = prune.waiting_reason(state, "b")
    assert why is not None and "2 repeated run(s)" in why and "needs 3" in why
    state.variants["v0003"] = _run("v0003", "b", base_curve(-0.02))
    assert prune.waiting_reason(state, "b") is None
    ref = prune.reference(state, "b")
    assert ref is not None and ref.budget == 10.0 and ref.full_seconds == 12.0


def test_options_are_checked() -> None:
    assert prune.parse_grace("20%") == pytest.approx(0.2)
    assert prune.parse_grace("0.35") == pytest.approx(0.35)
    for bad in ("120%", "-1", "soon", "1"):
        with pytest.raises(ResearchError, match="--prune-grace"):
            prune.parse_grace(bad)
    with pytest.raises(ResearchError, match="--prune-k"):
        prune.options("median", "20%", 0.0)


# -- progress lines --------------------------------------------------------------------------
def test_default_pattern_follows_the_metric_and_is_checked() -> None:
    pattern = progress.default_pattern("val_loss")
    got = progress.parse_lines(
        __import__("re").compile(pattern),
        ["progress: elapsed=1.5 val_loss=2.25", "progress: elapsed=2 val_bpb=9", "x"],
    )
    assert got == [[1.5, 2.25]]
    with pytest.raises(ValueError, match="two groups"):
        progress.check_progress_pattern(r"progress: ([0-9.]+)")
    with pytest.raises(ValueError, match="not a valid"):
        progress.check_progress_pattern(r"progress: ([0-9.]+")
    assert progress.check_progress_pattern(r"t=(?P<elapsed>\S+) loss=(?P<value>\S+)")


def test_a_huge_line_is_skipped_and_the_rest_is_read(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    with open(log, "wb") as fh:
        fh.write(b"progress: elapsed=1 val_bpb=3.0\n")
        fh.write(b"progress: elapsed=2 val_bpb=" + b"9" * (8 << 20) + b"\n")  # 8 MB, one line
        fh.write(b"\rstep 5\rprogress: elapsed=3 val_bpb=2.5\n")
        fh.write(b"progress: elapsed=2.5 val_bpb=1.0\n")  # back in time: dropped
        fh.write(b"progress: elapsed=4 val_bpb=nan\nprogress: elapsed=5 val_bpb=2.0")
    pattern = progress.default_pattern("val_bpb")
    assert progress.read_curve(log, pattern) == [[1.0, 3.0], [3.0, 2.5], [5.0, 2.0]]
    assert progress.tail_curve(log, pattern)[-1] == [5.0, 2.0]  # the live look reads the end


def test_a_flood_of_lines_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    n = 200_000
    log.write_text("".join(f"progress: elapsed={i} val_bpb={1 / (i + 1):.6f}\n" for i in range(n)))
    curve = progress.read_curve(log, progress.default_pattern("val_bpb"))
    assert len(curve) <= progress.MAX_POINTS
    assert curve[0][0] == 0.0 and curve[-1][0] == n - 1  # the span is kept
    assert all(a[0] < b[0] for a, b in itertools.pairwise(curve))
    tail = progress.tail_curve(log, progress.default_pattern("val_bpb"))
    assert len(tail) < 3000 and tail[-1][0] == n - 1  # the live look reads only the end


def test_curves_from_the_ledger_are_validated_and_interpolated() -> None:
    assert progress.valid_curve("no") == []
    assert progress.valid_curve([[0, 1], [2, "x"], [1, 3], [0.5, 9], [True, 1]]) == [
        [0.0, 1.0],
        [1.0, 3.0],
    ]
    curve = [[1.0, 3.0], [3.0, 2.0]]
    assert progress.at(curve, 2.0) == pytest.approx(2.5)
    assert progress.at(curve, 0.5) is None and progress.at(curve, 3.5) is None
    assert math.isclose(progress.at(curve, 3.0) or 0, 2.0)


def test_progress_png_marks_pruned_rows_apart_from_crashes(tmp_path: Path) -> None:
    from gpuswarm.research.plot import PlotRow, progress_png, summary_line

    rows = [
        PlotRow(2.0, "keep", "baseline", base=2.0, change=False),
        PlotRow(None, "pruned", "double LR (pruned at 3s of 10s)"),
        PlotRow(None, "crash", "OOM"),
        PlotRow(1.9, "keep", "halve LR", base=1.9),
    ]
    assert summary_line(rows, "val_bpb", "min") == (
        "4 experiments, 1 kept, best val_bpb 1.900000, 1 pruned, 1 crashed"
    )
    assert progress_png(rows, tmp_path / "p.png", metric="val_bpb").stat().st_size > 0


def test_a_stop_journaled_after_the_run_ended_is_moot() -> None:
    from gpuswarm.research.journal import apply_event

    state = ExperimentState(base="b")
    apply_event(state, {"ev": "variant", "id": "v0001", "kind": "variant", "commit": "c",
                        "parent": "b", "description": "x", "ts": 1.0})  # fmt: skip
    apply_event(state, {"ev": "pruned", "id": "v0001", "t": 3.0})
    assert state.variants["v0001"].pruned == {"ev": "pruned", "id": "v0001", "t": 3.0}
    apply_event(state, {"ev": "variant", "id": "v0002", "kind": "variant", "commit": "d",
                        "parent": "b", "description": "y", "ts": 2.0})  # fmt: skip
    apply_event(state, {"ev": "finished", "id": "v0002", "ok": True, "metric": 1.0})
    apply_event(state, {"ev": "pruned", "id": "v0002", "t": 3.0})  # it had ended: ignored
    assert state.variants["v0002"].pruned is None
    assert not prune.prunable(state.variants["v0002"])
