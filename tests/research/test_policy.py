"""The research decision policies (greedy, noise-aware, manual; rounds and async; baselines
first; confirmation runs) as pure functions of an ExperimentState: fast unit tests, no runner,
no git."""

from __future__ import annotations

from typing import Any

import pytest

from gpuswarm.research.experiment import ExperimentConfig, metric_pattern
from gpuswarm.research.journal import ExperimentState, Variant
from gpuswarm.research.policy import Decision, decide

BASE = "b" * 40
OLD = "a" * 40


def cfg(**kw: Any) -> ExperimentConfig:
    return ExperimentConfig(
        tag="t",
        branch="autoresearch/t",
        edit=["train.py"],
        command="python train.py",
        metric_pattern=metric_pattern("val_bpb"),
        **kw,
    )


SEALING = "sealed" in ExperimentState.__dataclass_fields__


def state(
    mode: str = "rounds", metric: float | None = 1.0, sealed: tuple[int, ...] = (1, 2), **kw: Any
) -> ExperimentState:
    """A state at BASE (measured ``metric``); in rounds mode, rounds ``sealed`` take no more
    variants (``research wait`` or the loop sealed them)."""
    st = ExperimentState(base=BASE, mode=mode, **kw)
    if SEALING:
        st.sealed = set(sealed)
        st.round = max(sealed, default=0) + 1
    if metric is not None:
        st.base_metric[BASE] = metric
    return st


def add(
    st: ExperimentState,
    metric: float | None = None,
    *,
    crash: str | None = None,
    kind: str = "variant",
    parent: str = BASE,
    round: int = 1,
    ts: float | None = None,
) -> Variant:
    """A variant of ``st``: in flight (no metric, no crash), finished with ``metric``, or
    crashed with reason ``crash``."""
    vid = st.next_id()
    n = int(vid[1:])
    v = Variant(vid, kind, f"{n:040x}", parent, f"idea {n}", round, "manual", float(n))
    if crash is not None:
        v.finished = {"ok": False, "metric": None, "reason": crash, "ts": ts or 100.0 + n}
    elif metric is not None:
        v.finished = {"ok": True, "metric": metric, "reason": None, "ts": ts or 100.0 + n}
    st.variants[vid] = v
    return v


def by_id(decisions: list[Decision]) -> dict[str, str]:
    return {d.id: d.status for d in decisions}


def test_policy_rounds_waits_for_the_whole_round() -> None:
    st = state("rounds")
    a = add(st, 0.9)
    b = add(st)  # still running
    assert decide(cfg(), st) == []
    b.finished = {"ok": True, "metric": 0.8, "ts": 200.0}
    got = decide(cfg(), st)
    assert by_id(got) == {a.id: "discard", b.id: "keep"}
    assert "not the best" in next(d.reason for d in got if d.id == a.id)


@pytest.mark.skipif(not SEALING, reason="rounds are not sealed in this version")
def test_policy_rounds_waits_for_the_round_to_be_sealed() -> None:
    st = state("rounds", sealed=())
    a, b = add(st, 0.9), add(st, 0.95)  # all finished, but more may still join the round
    crashed = add(st, crash="exit 1")
    assert decide(cfg(), st) == [Decision(crashed.id, "crash", "exit 1")]
    st.sealed.add(1)
    assert by_id(decide(cfg(), st)) == {a.id: "keep", b.id: "discard", crashed.id: "crash"}


def test_policy_rounds_keeps_the_best_improving_one() -> None:
    st = state("rounds")
    worse = add(st, 1.2)
    good = add(st, 0.95)
    best = add(st, 0.9)
    equal = add(st, 1.0)  # not strictly better
    got = by_id(decide(cfg(), st))
    assert got == {worse.id: "discard", good.id: "discard", best.id: "keep", equal.id: "discard"}


def test_policy_rounds_nothing_improves_keeps_nothing() -> None:
    st = state("rounds")
    ids = [add(st, m).id for m in (1.0, 1.1, 1.5)]
    assert by_id(decide(cfg(), st)) == dict.fromkeys(ids, "discard")


def test_policy_rounds_later_round_waits_for_its_own_members() -> None:
    st = state("rounds")
    r1 = add(st, 0.9, round=1)
    r2 = add(st, 0.5, round=2)
    add(st, round=2)  # round 2 still running
    assert by_id(decide(cfg(), st)) == {r1.id: "keep"}
    assert r2.id not in by_id(decide(cfg(), st))


def test_policy_crash_is_decided_at_once() -> None:
    st = state("rounds")
    crashed = add(st, crash="exit 1")
    add(st, 0.9)
    add(st)  # the round is still open
    got = decide(cfg(), st)
    assert got == [Decision(crashed.id, "crash", "exit 1")]


def test_policy_baseline_first() -> None:
    st = state("async", metric=None)
    v = add(st, 0.9)
    base = add(st, kind="baseline", parent=BASE)
    assert decide(cfg(), st) == []  # nothing is judged before its baseline
    base.finished = {"ok": True, "metric": 1.0, "ts": 300.0}
    got = decide(cfg(), st)
    assert got[0] == Decision(base.id, "keep", "baseline")
    assert v.id not in by_id(got)  # judged on the next pass, once the baseline's metric is in


def test_policy_manual_decides_only_crashes() -> None:
    for mode in ("rounds", "async"):
        st = state(mode)
        add(st, 0.5)
        add(st, 2.0)
        crashed = add(st, crash="timeout after 10s")
        got = decide(cfg(policy="manual"), st)
        assert got == [Decision(crashed.id, "crash", "timeout after 10s")], mode


def baselines(st: ExperimentState, *metrics: float) -> None:
    """Repeated baseline runs of BASE (their spread is the noise estimate)."""
    for m in metrics:
        b = add(st, m, kind="baseline")
        b.commit = BASE
        b.decision = {"status": "keep"}
    st.base_metric[BASE] = sum(metrics) / len(metrics)


def test_policy_noise_aware_confirms_a_gain_within_the_noise() -> None:
    """Noise-aware (the default since the seed's rules): a gain beyond k x the spread of the
    repeated baselines is kept; one within it is re-run (``noise_confirm``) before it may move
    BASE, or discarded when re-runs are off (the old noise-aware); greedy keeps it at once."""
    noisy = cfg(policy="noise-aware", noise_k=2.0)  # stdev of 1.0, 1.02: 0.01414; margin 0.0283

    st = state("async")
    baselines(st, 1.0, 1.02)
    small = add(st, 0.99)
    (d,) = decide(noisy, st)
    assert (d.id, d.status, d.runs) == (small.id, "confirm", 2)
    assert d.reason.startswith("within the noise")
    assert by_id(decide(cfg(policy="greedy"), st)) == {small.id: "keep"}
    (off,) = decide(cfg(noise_confirm=0), st)
    assert off.status == "discard" and "re-runs are off" in off.reason

    st = state("async")
    baselines(st, 1.0, 1.02)
    big = add(st, 0.98)
    assert by_id(decide(noisy, st)) == {big.id: "keep"}

    # one baseline run gives no spread: greedy until there are two
    st = state("async")
    baselines(st, 1.0)
    small = add(st, 0.999)
    assert by_id(decide(noisy, st)) == {small.id: "keep"}

    # rounds: the best gain within the noise is confirmed, the round waits for it
    st = state("rounds")
    baselines(st, 1.0, 1.02)
    a, b = add(st, 0.99), add(st, 0.995)
    assert by_id(decide(noisy, st)) == {a.id: "confirm"}
    assert by_id(decide(cfg(noise_confirm=0), st)) == {a.id: "discard", b.id: "discard"}


def test_policy_goal_max() -> None:
    st = state("rounds", metric=0.5)
    low, high, higher = add(st, 0.4), add(st, 0.6), add(st, 0.7)
    got = by_id(decide(cfg(goal="max"), st))
    assert got == {low.id: "discard", high.id: "discard", higher.id: "keep"}

    st = state("async", metric=0.5)
    low = add(st, 0.4, ts=1.0)
    high = add(st, 0.6, ts=2.0)
    assert by_id(decide(cfg(goal="max"), st)) == {low.id: "discard", high.id: "keep"}


def test_policy_async_decides_on_arrival_and_rebases_late_winners() -> None:
    st = state("async", metric=0.9)
    st.base_metric[OLD] = 1.0
    late = add(st, 0.95, parent=OLD, ts=5.0)  # beat its own parent, but not the best: discard
    stale = add(st, 1.05, parent=OLD, ts=6.0)
    add(st)  # in flight: does not hold the others back in async mode
    first = add(st, 0.85, ts=4.0)
    after = add(st, 0.8, ts=7.0)
    got = decide(cfg(), st)
    # in arrival order; the keep moves BASE, so the pass stops there
    assert got == [Decision(first.id, "keep", "better than BASE")]
    st.variants[first.id].decision = {"status": "keep"}
    st.base_metric[first.commit] = 0.85
    st.base = first.commit
    got = decide(cfg(), st)
    # a late winner (better than the current best) is re-based; the others are discarded
    assert by_id(got) == {late.id: "discard", stale.id: "discard", after.id: "rebase"}


# -- confirmation runs of a would-be keep ---------------------------------------------------
def test_policy_confirm_queues_waits_then_decides_by_the_mean() -> None:
    conf = cfg(confirm=2)
    st = state("async", metric=1.0)
    v = add(st, 0.9)
    assert decide(conf, st) == [
        Decision(v.id, "confirm", "better than BASE; confirming with 2 more runs", runs=2)
    ]
    c1 = add(st, 0.92, kind="confirm")
    c2 = add(st, kind="confirm")  # still running
    c1.origin = c2.origin = v.id
    assert decide(conf, st) == []  # waits for every confirmation run
    c2.finished = {"ok": True, "metric": 0.94, "reason": None, "ts": 200.0}
    (keep,) = decide(conf, st)
    assert keep.status == "keep" and keep.metric == pytest.approx((0.9 + 0.92 + 0.94) / 3)
    # a mean that no longer wins: not confirmed
    c2.finished = {"ok": True, "metric": 1.3, "reason": None, "ts": 200.0}
    (no,) = decide(conf, st)
    assert no.status == "discard" and no.reason.startswith("not confirmed: mean of 3 runs")
    # confirmation rows follow their origin's decision
    v.decision = {"status": "discard"}
    assert by_id(decide(conf, st)) == {c1.id: "discard", c2.id: "discard"}


def test_policy_confirm_in_rounds_holds_the_round() -> None:
    conf = cfg(confirm=1)
    st = state("rounds", metric=1.0)
    best, other = add(st, 0.8), add(st, 0.95)
    assert by_id(decide(conf, st)) == {best.id: "confirm"}
    c = add(st, 0.82, kind="confirm")
    c.origin = best.id
    assert by_id(decide(conf, st)) == {best.id: "keep", other.id: "discard"}
