"""Decision policies: which finished experiments are kept, discarded, or re-based.

Pure functions of the replayed state: settle.py applies what they return.

- ``greedy``: kept when strictly better than the metric of its parent BASE.
- ``noise-aware``: kept when better by more than ``k`` x the spread (sample standard deviation)
  of repeated baselines; greedy until at least two baseline runs of a BASE succeeded.
- ``confirm: N`` (any automatic policy): a would-be keep is first re-run N times (on whatever
  GPUs are free: usually others) and kept only if the mean of all its runs still wins.
- ``manual``: nothing is decided automatically (``research keep`` / ``discard``); crashes are.

Modes: ``rounds`` decides a round once it is sealed (``research wait`` or the loop seals the
open round) and all of its variants have finished (the best improving one is kept, the others
discarded); ``async`` decides each variant when it finishes. A winner
(better than the current best) whose parent is no longer BASE (async, or a round that
straddled a keep) is re-based onto BASE and evaluated again as a combination.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuswarm.research.experiment import ExperimentConfig
from gpuswarm.research.journal import ExperimentState, Variant


@dataclass(frozen=True)
class Decision:
    id: str
    status: str  # keep | discard | crash | rebase (discard, evaluate a combination) | confirm
    reason: str
    metric: float | None = None  # BASE's metric after a confirmed keep (the mean of the runs)


def spread(state: ExperimentState, commit: str) -> float | None:
    runs = state.baselines.get(commit, [])
    return statistics.stdev(runs) if len(runs) >= 2 else None


def better(cfg: ExperimentConfig, state: ExperimentState, metric: float, reference: float) -> bool:
    margin = 0.0
    if cfg.policy == "noise-aware":
        noise = spread(state, state.base)
        margin = cfg.noise_k * noise if noise is not None else 0.0
    if cfg.goal == "min":
        return metric < reference - margin
    return metric > reference + margin


def _metric(v: Variant) -> float:
    assert v.finished is not None
    return float(v.finished["metric"])


def _ok(v: Variant) -> bool:
    return bool(v.finished and v.finished.get("ok"))


def decide(cfg: ExperimentConfig, state: ExperimentState) -> list[Decision]:
    """The decisions the state allows now, in the order they must be applied."""
    out: list[Decision] = []
    waiting = [v for v in state.undecided() if v.finished is not None]
    for v in waiting:
        if not _ok(v):
            assert v.finished is not None
            out.append(Decision(v.id, "crash", str(v.finished.get("reason") or "crash")))
        elif v.kind == "baseline":
            out.append(Decision(v.id, "keep", "baseline"))
        elif v.kind == "confirm":
            origin = state.variants.get(v.origin or "")
            if origin is not None and origin.decision is not None:
                status = "keep" if origin.decision["status"] == "keep" else "discard"
                out.append(Decision(v.id, status, f"confirmation run of {origin.id}"))
    decided = {d.id for d in out}
    if cfg.policy == "manual":
        return out
    if any(v.kind == "baseline" for v in state.in_flight()):
        return out  # nothing is judged before the baseline it is judged against
    pending = [v for v in waiting if v.id not in decided and v.kind != "confirm"]
    if state.mode == "async":
        out.extend(_decide_async(cfg, state, pending))
    else:
        out.extend(_decide_rounds(cfg, state, pending))
    return out


def _reference(state: ExperimentState, v: Variant) -> float | None:
    """What ``v`` must beat: its parent's metric (the current best when its parent is BASE)."""
    return state.base_metric.get(v.parent)


def _decide_async(
    cfg: ExperimentConfig, state: ExperimentState, pending: list[Variant]
) -> list[Decision]:
    out: list[Decision] = []
    best = state.best
    for v in sorted(pending, key=lambda x: x.finished["ts"] if x.finished else 0.0):
        if best is None or _reference(state, v) is None:
            continue  # no measured metric to judge it by yet (a baseline must run first)
        if not better(cfg, state, _metric(v), best):
            stale = "" if v.parent == state.base else " (measured on an older BASE)"
            out.append(Decision(v.id, "discard", _worse(cfg, best) + stale))
        elif v.parent == state.base:
            d = _confirmed(cfg, state, v, best, "better than BASE")
            if d is not None:
                out.append(d)
                if d.status == "keep":
                    return out  # BASE moves: the rest is judged against the new one next pass
        else:  # a winner, but measured without what was kept since: combine and measure again
            out.append(Decision(v.id, "rebase", "better than BASE, measured on an older BASE"))
    return out


def _decide_rounds(
    cfg: ExperimentConfig, state: ExperimentState, pending: list[Variant]
) -> list[Decision]:
    out: list[Decision] = []
    rounds = sorted({v.round for v in pending})
    open_rounds = {v.round for v in state.in_flight() if v.kind != "confirm"}
    for r in rounds:
        if r in open_rounds or r not in state.sealed:
            continue  # decided once sealed and all of its variants have finished
        members = [v for v in pending if v.round == r]
        refs = {v.id: _reference(state, v) for v in members}
        if any(ref is None for ref in refs.values()):
            continue
        winners = [v for v in members if better(cfg, state, _metric(v), refs[v.id] or 0.0)]
        pick = min if cfg.goal == "min" else max
        winner = pick(winners, key=_metric) if winners else None
        verdict = None
        if winner is not None and winner.parent == state.base:
            verdict = _confirmed(cfg, state, winner, refs[winner.id] or 0.0, "best of its round")
            if verdict is None or verdict.status == "confirm":
                out.extend([verdict] if verdict else [])
                continue  # the round waits for its winner's confirmation runs
        for v in members:
            if v is winner:
                d = verdict or Decision(v.id, "rebase", "best of its round")
                out.append(d)
            elif v in winners:
                out.append(Decision(v.id, "discard", "improved, but not the best of its round"))
            else:
                out.append(Decision(v.id, "discard", _worse(cfg, refs[v.id] or 0.0)))
        if verdict is not None and verdict.status == "keep":
            return out  # BASE moves; later rounds are judged on the next pass
    return out


def _confirmed(
    cfg: ExperimentConfig, state: ExperimentState, v: Variant, ref: float, why: str
) -> Decision | None:
    """Keep ``v``, or first confirm it with ``cfg.confirm`` re-runs of its commit (judged by the
    mean of all its runs); None while confirmation runs are still in flight."""
    if cfg.confirm <= 0:
        return Decision(v.id, "keep", why)
    runs = [c for c in state.variants.values() if c.kind == "confirm" and c.origin == v.id]
    if not runs:
        return Decision(v.id, "confirm", f"{why}; confirming with {cfg.confirm} more runs")
    if any(c.finished is None for c in runs):
        return None
    if not all(_ok(c) for c in runs):
        return Decision(v.id, "discard", f"{why}, but a confirmation run crashed")
    mean = statistics.fmean([_metric(v), *(_metric(c) for c in runs)])
    if not better(cfg, state, mean, ref):
        return Decision(v.id, "discard", f"not confirmed: mean of {len(runs) + 1} runs {mean:.6f}")
    return Decision(v.id, "keep", f"{why}; confirmed, mean of {len(runs) + 1} runs", mean)


def _worse(cfg: ExperimentConfig, ref: float) -> str:
    word = "lower" if cfg.goal == "min" else "higher"
    return f"not {word} than {ref:.6f}"
