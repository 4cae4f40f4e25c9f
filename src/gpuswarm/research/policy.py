"""Decision policies: which finished experiments are kept, discarded, confirmed or re-based.

Pure functions of the replayed state: settle.py applies what they return (and ``research log
--policy`` replays them on a ledger with other settings). What one variant's runs say under
the seed's rules (noise, simplicity, VRAM, the platform) is :func:`rules.judge`; here the
verdicts become decisions:

- ``noise-aware`` (default): a gain beyond ``noise_k`` x the spread of repeated runs of one
  commit is a win; a gain within it is re-run ``noise_confirm`` times and kept only if the mean
  of all its runs gains more than ``noise_k`` x spread / sqrt(runs). Without a spread yet (one
  baseline run) it decides as greedy.
- ``greedy``: a win is strictly better than BASE.
- ``confirm: N`` (any automatic policy): every would-be keep is first re-run N times.
- ``manual``: nothing is decided automatically (``research keep`` / ``discard``); crashes are.
- under every automatic policy: a change that adds lines must gain ``gain_per_line`` per line,
  one that removes lines and measures equal is kept (a simplification), one that raises peak
  memory by more than ``vram_share`` must gain ``vram_gain``, and with several platforms only
  wins on the ``base_platform`` move BASE.

Modes: ``rounds`` decides a round once it is sealed (``research wait`` or the loop seals the
open round) and all of its variants have finished (the best win is kept, else the simplification
removing most lines, else the best gain within the noise is confirmed); ``async`` decides each
variant when it finishes. A would-be keep whose parent is no longer BASE (async, or a round that
straddled a keep) is re-based onto BASE and evaluated again as a combination.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuswarm.research import controls, rules
from gpuswarm.research.experiment import ExperimentConfig
from gpuswarm.research.journal import ExperimentState, Variant
from gpuswarm.research.rules import Verdict


@dataclass(frozen=True)
class Decision:
    id: str
    status: str  # keep | discard | crash | pruned | confirm | rebase (discard, evaluate a combo)
    reason: str
    metric: float | None = None  # BASE's metric after a keep that is not its single run
    note: str = ""  # its results.tsv row's word on the rule that decided ("+0.0008 for +20 lines")
    runs: int = 0  # confirm: how many re-runs to queue


def spread(state: ExperimentState, commit: str) -> float | None:
    """The sample standard deviation of ``commit``'s baseline runs (None: fewer than two)."""
    runs = state.baselines.get(commit, [])
    return statistics.stdev(runs) if len(runs) >= 2 else None


def _ok(v: Variant) -> bool:
    return bool(v.finished and v.finished.get("ok"))


def decide(cfg: ExperimentConfig, state: ExperimentState) -> list[Decision]:
    """The decisions the state allows now, in the order they must be applied."""
    out: list[Decision] = []
    waiting = [v for v in state.undecided() if v.finished is not None]
    for v in waiting:
        if not _ok(v):
            assert v.finished is not None
            status = "pruned" if v.finished.get("pruned") else "crash"  # pruned: issue 38
            out.append(Decision(v.id, status, str(v.finished.get("reason") or status)))
        elif v.kind == "baseline":
            out.append(Decision(v.id, "keep", "baseline"))
        elif v.kind == "control":  # a re-run of BASE: the reference of its period
            out.append(Decision(v.id, "keep", "control run of BASE"))
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


def _no_baseline(state: ExperimentState, v: Variant) -> Decision | None:
    """``v`` ran on a platform where no baseline of BASE could be measured (the baseline runs
    kept landing on other GPUs): discarded rather than waited for forever."""
    p = rules.platform_of(v)
    if not rules.baseline_given_up(state, p):
        return None
    reason = f"no baseline of BASE on {p or 'its platform'}: nothing to compare it with there"
    return Decision(v.id, "discard", reason, note=f"no baseline on {rules.short_platform(p)}")


def _decide_async(
    cfg: ExperimentConfig, state: ExperimentState, pending: list[Variant]
) -> list[Decision]:
    out: list[Decision] = []
    if state.best is None and not rules.multi_platform(state):
        return out  # no measured metric to judge by yet (a baseline must run first)
    for v in sorted(pending, key=lambda x: x.finished["ts"] if x.finished else 0.0):
        verdict = rules.judge(cfg, state, v, state.base, "better than BASE")
        if verdict is None and v.parent != state.base and controls.in_use(state):
            # paired, and BASE moved since v ran: what does not beat its own BASE's runs of
            # its period is discarded now (its re-runs withdrawn), not after a control run
            own = rules.judge(cfg, state, v, v.parent, "better than its BASE")
            verdict = own if own is not None and own.kind in ("lose", "noise") else None
        if verdict is None:
            given_up = _no_baseline(state, v)
            out.extend([given_up] if given_up else [])
            continue  # its platform has no measurement of BASE yet: one is queued
        verdict = _platform_check(cfg, state, v, verdict)
        stale = "" if v.parent == state.base else " (measured on an older BASE)"
        if verdict.kind == "lose" or (verdict.kind == "noise" and v.parent != state.base):
            out.append(_discard(state, v, verdict, stale))
        elif v.parent == state.base:
            d = _settled(cfg, state, v, verdict)
            if d is not None:
                out.append(d)
                if d.status == "keep":
                    return out  # BASE moves: the rest is judged against the new one next pass
        else:  # a would-be keep measured without what was kept since: combine, measure again
            out.append(Decision(v.id, "rebase", f"{verdict.reason}, measured on an older BASE"))
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
        verdicts, given_up = _round_verdicts(cfg, state, members)
        if len(verdicts) + len(given_up) < len(members):
            continue  # a member's platform has no measurement of its parent yet
        judged = [v for v in members if v.id in verdicts]
        winner = _pick(cfg, state, judged, verdicts)
        verdict = None
        if winner is not None and winner.parent == state.base:
            verdict = _settled(cfg, state, winner, verdicts[winner.id])
            if verdict is None or verdict.status == "confirm":
                out.extend([verdict] if verdict else [])
                continue  # the round waits for its winner's confirmation runs
        out.extend(given_up)
        for v in judged:
            mine = verdicts[v.id]
            if v is winner:
                out.append(verdict or Decision(v.id, "rebase", mine.reason))
            elif mine.kind in ("win", "simplification"):
                better = "improved" if mine.kind == "win" else "simpler"
                out.append(Decision(v.id, "discard", f"{better}, but not the best of its round"))
            else:
                out.append(_discard(state, v, mine, ""))
        if verdict is not None and verdict.status == "keep":
            return out  # BASE moves; later rounds are judged on the next pass
    return out


def _round_verdicts(
    cfg: ExperimentConfig, state: ExperimentState, members: list[Variant]
) -> tuple[dict[str, Verdict], list[Decision]]:
    """Each member's verdict against its parent; discards of those no baseline can judge."""
    verdicts: dict[str, Verdict] = {}
    given_up: list[Decision] = []
    for v in members:
        verdict = rules.judge(cfg, state, v, v.parent, "best of its round")
        if verdict is not None:
            verdicts[v.id] = _platform_check(cfg, state, v, verdict)
        elif v.parent != state.base:  # its older BASE never ran there, and never will now
            p = rules.platform_of(v)
            reason = f"measured on an older BASE that has no run on {p}: nothing to compare it with"
            given_up.append(Decision(v.id, "discard", reason, note="no baseline on its platform"))
        elif (d := _no_baseline(state, v)) is not None:
            given_up.append(d)
    return verdicts, given_up


def _pick(
    cfg: ExperimentConfig,
    state: ExperimentState,
    members: list[Variant],
    verdicts: dict[str, Verdict],
) -> Variant | None:
    """The round's candidate: the biggest win, else the simplification removing most lines,
    else (noise-aware, re-runs allowed) the biggest gain within the noise, to be confirmed."""
    wins = [v for v in members if verdicts[v.id].kind == "win"]
    if wins:
        return max(wins, key=lambda v: verdicts[v.id].gain)
    simpler = [v for v in members if verdicts[v.id].kind == "simplification"]
    if simpler:
        return min(simpler, key=lambda v: (verdicts[v.id].lines, -verdicts[v.id].gain))
    noisy = [v for v in members if verdicts[v.id].kind == "noise" and v.parent == state.base]
    if noisy and _reruns(cfg, "noise") > 0:
        return max(noisy, key=lambda v: verdicts[v.id].gain)
    return None


def _platform_check(
    cfg: ExperimentConfig, state: ExperimentState, v: Variant, verdict: Verdict
) -> Verdict:
    """A would-be keep on a platform whose wins do not move BASE is a discard saying so."""
    p = rules.platform_of(v)
    if verdict.kind == "lose" or rules.moves_base(cfg, state, p):
        return verdict
    moves = rules.majority_platform(state) if cfg.base_platform == "majority" else cfg.base_platform
    return Verdict(
        "lose",
        verdict.gain,
        verdict.runs,
        f"{verdict.reason} on {p}, but BASE moves on wins on {moves} only (base_platform "
        f"{cfg.base_platform}); re-try it there: research try --from {v.id}",
        f"better on {rules.short_platform(p)}, BASE follows {rules.short_platform(moves)}",
        verdict.lines,
    )


def _reruns(cfg: ExperimentConfig, kind: str) -> int:
    """Confirmation runs a would-be keep of this verdict kind gets before it is kept."""
    if kind == "noise":
        return max(cfg.confirm, cfg.noise_confirm) if cfg.policy == "noise-aware" else 0
    return cfg.confirm if kind == "win" else 0


def _discard(
    state: ExperimentState, v: Variant, verdict: Verdict, suffix: str, *, reruns_off: bool = False
) -> Decision:
    """``v`` discarded by its verdict; ``reruns_off``: a gain within the noise that no re-run
    may confirm (noise_confirm 0). Re-runs of ``v`` still queued or running are withdrawn
    (settle.py) and the reason says so."""
    reason, note = verdict.reason + suffix, verdict.note
    waiting = [c for c in rules.confirmations(state, v) if c.finished is None]
    if waiting:
        reason += f"; {_plural(len(waiting), 're-run')} not needed now: withdrawn"
    if verdict.runs > 1:
        runs = [v, *rules.confirmations(state, v)]
        mean = statistics.fmean([m for c in runs if (m := rules.ok_metric(c)) is not None])
        reason = f"not confirmed: mean of {verdict.runs} runs {mean:.6f}; {reason}"
        rule = verdict.kind == "lose" and note  # lines, memory or platform: that rule says it
        note = note if rule else f"not confirmed by {verdict.runs} runs"
    elif verdict.kind == "noise" and reruns_off:
        reason += "; re-runs are off (noise_confirm 0)"
    return Decision(v.id, "discard", reason, note=note)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _settled(
    cfg: ExperimentConfig, state: ExperimentState, v: Variant, verdict: Verdict
) -> Decision | None:
    """Keep ``v`` (a win or simplification on BASE), or first confirm it with re-runs of its
    commit, judged by the mean gain of all its runs; None while re-runs are in flight."""
    need = _reruns(cfg, verdict.kind)
    runs = rules.confirmations(state, v)
    if verdict.kind == "noise" and need == 0:
        return _discard(state, v, verdict, "", reruns_off=True)
    if not runs:
        if need == 0:
            return Decision(v.id, "keep", verdict.reason, note=verdict.note)
        what = "within the noise" if verdict.kind == "noise" else verdict.reason
        return Decision(v.id, "confirm", f"{what}; confirming with {need} more runs", runs=need)
    if any(c.finished is None for c in runs):
        return None
    if not all(_ok(c) for c in runs):
        return Decision(v.id, "discard", f"{verdict.reason}, but a confirmation run crashed")
    n = len(runs) + 1
    if verdict.kind not in ("win", "simplification"):
        return _discard(state, v, verdict, "")
    return Decision(
        v.id,
        "keep",
        f"{verdict.reason}; confirmed, mean of {n} runs",
        _kept_metric(state, v, runs),
        verdict.note or f"confirmed by {n} runs",
    )


def _kept_metric(state: ExperimentState, v: Variant, runs: list[Variant]) -> float:
    """BASE's metric after keeping ``v``: the mean of its runs (on its own platform when
    there are several)."""
    same = [c for c in [v, *runs] if rules.platform_of(c) == rules.platform_of(v)]
    chosen = same if rules.multi_platform(state) else [v, *runs]
    return statistics.fmean([m for c in chosen if (m := rules.ok_metric(c)) is not None])
