"""Paired controls (issue 29, item 1): pairing, periods, the paired noise and drift, as pure
functions of a replayed state."""

from __future__ import annotations

import pytest

from gpuswarm.research import controls
from gpuswarm.research.journal import ExperimentState, Variant

BASE = "b" * 40


def run(
    state: ExperimentState, vid: str, kind: str, metric: float, start: float, end: float,
    commit: str = BASE,
) -> Variant:  # fmt: skip
    v = Variant(vid, kind, commit, BASE, vid, 1, "test", start)
    v.finished = {"ok": True, "metric": metric, "started": start, "ended": end,
                  "accelerator": "H100"}  # fmt: skip
    state.variants[vid] = v
    return v


def test_a_run_is_paired_with_the_base_run_nearest_in_time() -> None:
    s = ExperimentState(base=BASE, paired=True)
    run(s, "v0001", "baseline", 1.00, 0, 10)
    run(s, "v0002", "control", 0.90, 100, 110)
    v = run(s, "v0003", "variant", 0.89, 95, 105, commit="c" * 40)
    assert controls.paired_reference(s, BASE, v) == 0.90  # its period's, not the start's


def test_a_run_waits_for_a_control_of_its_period() -> None:
    s = ExperimentState(base=BASE, paired=True)
    run(s, "v0001", "baseline", 1.00, 0, 10)
    v = run(s, "v0002", "variant", 0.89, 50, 60, commit="c" * 40)
    assert controls.paired_reference(s, BASE, v) is None  # BASE last ran long before it
    assert controls.wanted(s) == "H100"  # a control is wanted on its GPU model
    pending = Variant("v0003", "control", BASE, BASE, "control", 1, "control", 55.0)
    s.variants["v0003"] = pending  # queued while it ran: the better pair, waited for
    assert controls.paired_reference(s, BASE, v) is None and controls.wanted(s) is None


def test_simultaneous_runs_are_one_period_and_the_noise_is_over_time() -> None:
    s = ExperimentState(base=BASE, paired=True)
    run(s, "v0001", "baseline", 1.000, 0, 10)
    run(s, "v0002", "baseline", 1.002, 0, 10)  # simultaneous: one period (mean 1.001)
    run(s, "v0003", "control", 0.991, 20, 30)
    run(s, "v0004", "control", 0.981, 40, 50)
    assert controls.periods(controls.base_runs(s, BASE, "H100")) == pytest.approx(
        [1.001, 0.991, 0.981]
    )
    est = controls.paired_noise(s, "H100")
    assert est is not None and est.sigma == pytest.approx(0.01)  # RMS of successive steps
    (d,) = controls.drift(s, noise_k=0.5)
    assert d.change == pytest.approx(-0.02) and d.periods == 3 and d.moving
    assert not controls.drift(s, noise_k=3.0)[0].moving
    assert "moved -0.020000 val_bpb over 1 min" in d.text("val_bpb")


def test_without_controls_nothing_is_paired() -> None:
    s = ExperimentState(base=BASE)
    run(s, "v0001", "baseline", 1.0, 0, 10)
    assert not controls.in_use(s) and controls.drift(s, 2.0) == [] and controls.wanted(s) is None
