"""Decision policies: which finished experiments are kept, discarded, or re-based.

Pure functions of the replayed state: settle.py applies what they return.

- ``greedy``: kept when strictly better than the metric of its parent BASE.
- ``noise-aware``: kept when better by more than ``k`` x the spread (sample standard deviation)
  of repeated baselines; greedy until at least two baseline runs of a BASE succeeded.
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

from gpuswarm.research.experiment import ExperimentConfig, State, Variant


@dataclass(frozen=True)
class Decision:
    id: str
    status: str  # keep | discard | crash | rebase (discard the original, evaluate a combination)
    reason: str


def spread(state: State, commit: str) -> float | None:
    runs = state.baselines.get(commit, [])
    return statistics.stdev(runs) if len(runs) >= 2 else None


def better(cfg: ExperimentConfig, state: State, metric: float, reference: float) -> bool:
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


def decide(cfg: ExperimentConfig, state: State) -> list[Decision]:
    """The decisions the state allows now, in the order they must be applied."""
    out: list[Decision] = []
    waiting = [v for v in state.undecided() if v.finished is not None]
    for v in waiting:
        if not _ok(v):
            assert v.finished is not None
            out.append(Decision(v.id, "crash", str(v.finished.get("reason") or "crash")))
        elif v.kind == "baseline":
            out.append(Decision(v.id, "keep", "baseline"))
    decided = {d.id for d in out}
    if cfg.policy == "manual":
        return out
    if any(v.kind == "baseline" for v in state.in_flight()):
        return out  # nothing is judged before the baseline it is judged against
    pending = [v for v in waiting if v.id not in decided]
    if state.mode == "async":
        out.extend(_decide_async(cfg, state, pending))
    else:
        out.extend(_decide_rounds(cfg, state, pending))
    return out


def _reference(state: State, v: Variant) -> float | None:
    """What ``v`` must beat: its parent's metric (the current best when its parent is BASE)."""
    return state.base_metric.get(v.parent)


def _decide_async(cfg: ExperimentConfig, state: State, pending: list[Variant]) -> list[Decision]:
    out: list[Decision] = []
    best = state.best
    for v in sorted(pending, key=lambda x: x.finished["ts"] if x.finished else 0.0):
        if best is None or _reference(state, v) is None:
            continue  # no measured metric to judge it by yet (a baseline must run first)
        if not better(cfg, state, _metric(v), best):
            stale = "" if v.parent == state.base else " (measured on an older BASE)"
            out.append(Decision(v.id, "discard", _worse(cfg, best) + stale))
        elif v.parent == state.base:
            out.append(Decision(v.id, "keep", "better than BASE"))
            return out  # BASE moves: the rest is judged against the new one on the next pass
        else:  # a winner, but measured without what was kept since: combine and measure again
            out.append(Decision(v.id, "rebase", "better than BASE, measured on an older BASE"))
    return out


def _decide_rounds(cfg: ExperimentConfig, state: State, pending: list[Variant]) -> list[Decision]:
    out: list[Decision] = []
    rounds = sorted({v.round for v in pending})
    open_rounds = {v.round for v in state.in_flight()}
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
        for v in members:
            if v is winner:
                status = "keep" if v.parent == state.base else "rebase"
                out.append(Decision(v.id, status, "best of its round"))
            elif v in winners:
                out.append(Decision(v.id, "discard", "improved, but not the best of its round"))
            else:
                out.append(Decision(v.id, "discard", _worse(cfg, refs[v.id] or 0.0)))
        if winner is not None and winner.parent == state.base:
            return out  # BASE moves; later rounds are judged on the next pass
    return out


def _worse(cfg: ExperimentConfig, ref: float) -> str:
    word = "lower" if cfg.goal == "min" else "higher"
    return f"not {word} than {ref:.6f}"
