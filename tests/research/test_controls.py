"""Paired controls (issue 29, item 1): pairing, periods, the paired noise and drift, as pure
functions of a replayed state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.outputs.html import esc
from gpuswarm.research import controls, rules, views
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, metric_pattern
from gpuswarm.research.journal import ExperimentState, Variant
from gpuswarm.research.policy import decide
from gpuswarm.research.readouts import shown
from gpuswarm.research.replay import parse_spec, replay_decisions
from gpuswarm.research.report import write_research_report

BASE = "b" * 40


def _cfg() -> ExperimentConfig:
    return ExperimentConfig(
        tag="t", branch="autoresearch/t", edit=["train.py"], command="python train.py",
        metric_pattern=metric_pattern("val_bpb"),
    )  # fmt: skip


def run(
    state: ExperimentState, vid: str, kind: str, metric: float, start: float, end: float,
    commit: str = BASE,
) -> Variant:  # fmt: skip
    v = Variant(vid, kind, commit, BASE, vid, 1, "test", start)
    v.finished = {"ok": True, "metric": metric, "started": start, "ended": end,
                  "accelerator": "H100", "ts": end}  # fmt: skip
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


def test_drift_beyond_the_noise_is_said_by_status_the_live_header_and_the_report(
    tmp_path: Path,
) -> None:
    """BASE's controls fall 0.01 a period (paired noise 0.01): after four steps the change,
    -0.04, is beyond noise_k 2 x 0.01, and every view says so and that the noise is paired."""
    cfg = _cfg()
    s = ExperimentState(base=BASE, paired=True)
    run(s, "v0001", "baseline", 1.00, 0, 10)
    for i, m in enumerate((0.99, 0.98, 0.97, 0.96)):
        run(s, f"v000{i + 2}", "control", m, 60 * (i + 1), 60 * (i + 1) + 10)
    s.base_metric[BASE] = 1.0
    drifts = [d.view() for d in controls.drift(s, cfg.noise_k)]  # status's "drift"
    assert drifts and drifts[0]["moving"], drifts
    (line,) = views.drift_lines(drifts, "val_bpb")  # status's text
    assert line.startswith("drift: BASE's controls on H100 moved -0.040000 val_bpb over 4 min")
    noise = views.noise_line({"noise": rules.noise_view(s), "policy": "noise-aware"})
    assert "sd 0.010000 paired (5 periods of BASE's runs)" in noise, noise
    header = views.live_header(cfg, s, "async")
    assert "noise sd 0.010000 paired  DRIFT -0.040000 (decisions paired)" in header, header
    html = write_research_report(ExpPaths(tmp_path, tmp_path), cfg, s, None).read_text()
    assert esc(line) in html and "paired (5 periods of BASE&#x27;s runs)" in html
    assert not controls.drift(s, noise_k=5.0)[0].moving  # within 5 x the noise: nothing said


def test_replay_of_a_paired_ledger(tmp_path: Path) -> None:
    """``research log --policy``: a control run is a reference, never BASE's metric (the
    replay said best = the last control's 0.78, where the experiment's is the keep's 0.80);
    a result whose replayed BASE never ran in its period says so."""
    c, d = "c" * 40, "d" * 40
    events: list[dict[str, Any]] = [
        {"ev": "init", "base": BASE, "gpu_models": {}},
        {"ev": "mode", "mode": "async"},
        {"ev": "controls", "paired": True},
    ]

    def add(vid: str, kind: str, commit: str, parent: str, m: float, t: float) -> None:
        events.append({"ev": "variant", "id": vid, "kind": kind, "commit": commit,
                       "parent": parent, "description": vid, "ts": t})  # fmt: skip
        events.append({"ev": "finished", "id": vid, "ok": True, "metric": m, "started": t,
                       "ended": t + 10, "accelerator": "H100", "ts": t + 10})  # fmt: skip

    add("v0001", "baseline", BASE, BASE, 1.00, 0)
    add("v0002", "baseline", BASE, BASE, 1.00, 0)
    add("v0003", "control", BASE, BASE, 0.95, 20)
    add("v0004", "control", BASE, BASE, 0.94, 40)
    add("v0005", "variant", c, BASE, 0.80, 40)
    events.append({"ev": "base", "from": BASE, "to": c, "id": "v0005"})
    add("v0006", "control", c, c, 0.78, 60)
    add("v0007", "variant", d, c, 0.79, 60)
    ExpPaths(tmp_path, tmp_path).ledger.write_text(
        "".join(json.dumps({"ts": 1.0, **e}) + "\n" for e in events)
    )
    paths, cfg = ExpPaths(tmp_path, tmp_path), _cfg()
    same = replay_decisions(paths, cfg)
    assert same["would_keep"] == ["v0005"] and same["best"] == 0.80, same["best"]
    strict = replay_decisions(paths, parse_spec(cfg, "noise-aware,noise_k=100"))
    rows = {r["id"]: r for r in strict["variants"]}
    assert strict["best"] == 1.00, strict["best"]  # the baselines' mean, not a control's 0.94
    assert rows["v0007"]["replayed"] == "wanted", rows["v0007"]
    assert "no run of the replayed BASE bbbbbbb of its period" in (
        rows["v0007"]["replayed_reason"] or ""
    )


def test_a_baseline_queued_on_a_model_is_the_run_of_base_a_result_there_waits_for() -> None:
    """Several GPU models: a keep moved BASE and a result on the H100 waits for a run of the
    new BASE there; settle queues a baseline pinned to the H100 (rules.baseline_wanted), and
    no control besides it (two runs of BASE for one wait)."""
    new = "c" * 40
    s = ExperimentState(base=new, paired=True, gpu_models={"A100": 2, "H100": 1}, mode="async")
    run(s, "v0001", "baseline", 1.00, 0, 10)
    s.variants["v0001"].finished["accelerator"] = "A100"  # type: ignore[index]
    run(s, "v0002", "baseline", 0.80, 0, 10)
    kept = run(s, "v0003", "variant", 0.90, 20, 30, commit=new)
    kept.finished["accelerator"] = "A100"  # type: ignore[index]
    kept.decision = {"status": "keep"}
    run(s, "v0004", "variant", 0.70, 25, 35, commit="d" * 40).parent = BASE
    assert controls.wanted(s) == "H100"  # nothing queued yet: a run of BASE is wanted there
    s.variants["v0005"] = Variant("v0005", "baseline", new, new, "baseline", 1, "baseline", 40.0)
    assert controls.wanted(s) is None and controls.waits_for_control(s, s.variants["v0004"])
    reason = shown(s, s.variants["v0004"])["reason"]  # status's "awaiting decision" line
    assert reason == "paired: waiting for a run of BASE of its period (v0005)", reason


def test_paired_a_stale_result_within_the_noise_of_its_own_base_is_discarded_at_once() -> None:
    """Async, paired (issue 29, item 2): A gains within the noise of its period's control and
    waits for its re-run; B wins and moves BASE. A is discarded at once, judged by its own
    BASE's runs of its period (its re-run withdrawn), not left waiting for a control of the
    new BASE while the re-run holds a GPU."""
    b2 = "e" * 40
    s = ExperimentState(base=b2, paired=True, mode="async")
    for vid, kind, m, t in (("v0001", "baseline", 1.00, 0), ("v0002", "baseline", 1.00, 0),
                            ("v0003", "control", 0.99, 20)):  # fmt: skip
        run(s, vid, kind, m, t, t + 10).decision = {"status": "keep"}
    s.base_metric.update({BASE: 1.0, b2: 0.90})
    a = run(s, "v0004", "variant", 0.985, 20, 30, commit="a" * 40)
    run(s, "v0005", "variant", 0.90, 20, 30, commit=b2).decision = {"status": "keep"}
    s.variants["v0006"] = Variant(
        "v0006", "confirm", a.commit, BASE, "A (confirmation 1/1)", 1, "confirm", 31.0, a.id
    )
    (d,) = decide(_cfg(), s)
    assert (d.id, d.status) == ("v0004", "discard"), d
    assert "within the noise" in d.reason and "measured on an older BASE" in d.reason, d
    assert "1 re-run not needed now: withdrawn" in d.reason, d


def test_a_real_win_late_on_a_worsening_machine_is_kept_against_its_periods_control() -> None:
    """The worsening machine's failure (issue 29, item 1): BASE's runs get 0.001 worse every
    period; a real change 0.005 better, run in the tenth period, measures 0.004 worse than the
    first baselines. Unpaired it is discarded; paired with its period's control it is kept."""

    def state(with_controls: bool) -> ExperimentState:
        s = ExperimentState(base=BASE, paired=with_controls, mode="async")
        for vid in ("v0001", "v0002"):
            run(s, vid, "baseline", 1.000, 0, 10).decision = {"status": "keep"}
        s.base_metric[BASE] = 1.0
        s.baselines[BASE] = [1.0, 1.0]
        for k in range(1, 10 if with_controls else 1):
            run(s, f"c{k:04d}", "control", 1.000 + 0.001 * k, 20 * k, 20 * k + 10).decision = {
                "status": "keep"
            }
        run(s, "v0100", "variant", 1.009 - 0.005, 180, 190, commit="a" * 40)
        return s

    (unpaired,) = decide(_cfg(), state(False))
    assert (unpaired.id, unpaired.status) == ("v0100", "discard"), unpaired
    (paired,) = decide(_cfg(), state(True))
    assert (paired.id, paired.status) == ("v0100", "keep"), paired
