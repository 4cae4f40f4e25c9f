"""What pruning would have changed (issue 38): ``research log --policy SPEC --prune RULE``.

The replay (``replay.py``) feeds the ledger's events to the policy; with a pruning rule, each
finished run of a change is first shown to the rule the way the loop would have seen it while
it ran: its recorded curve point by point, against the curves the replayed BASE's runs had
recorded by then. The first point the rule stops it at makes it a ``pruned`` run (its metric
is never seen, so it cannot be kept), and the training it would not have run (its curve's end
less that point) is the GPU time saved. A run the loop pruned for real has no curve past that
point: it stays pruned (a replay cannot tell what it would have measured).
"""

from __future__ import annotations

from gpuswarm.research import progress, prune
from gpuswarm.research.entries import FinishedEntry
from gpuswarm.research.experiment import ExperimentConfig
from gpuswarm.research.figures import CHANGES
from gpuswarm.research.journal import ExperimentState
from gpuswarm.research.payloads import PruningReplay, ReplayedPrune

LOOKS = 50  # points of a recorded curve the rule is shown (the loop looks twice a second)


def replay_finished(
    cfg: ExperimentConfig,
    state: ExperimentState,
    e: FinishedEntry,
    opts: prune.PruneOptions,
    found: dict[str, ReplayedPrune],
    cache: dict[str, progress.Curve],
) -> FinishedEntry:
    """The ``finished`` event ``e`` as it would read with ``opts`` pruning (``found`` collects
    each replayed prune: id -> its record and the seconds saved; ``cache``: the recorded runs'
    curves, read once per replay)."""
    v = state.variants.get(str(e.get("id")))
    real = e.get("pruned")
    if opts.on and v is not None and isinstance(real, dict):  # pruned for real
        saved_s = e.get("saved_s") or 0.0
        found[v.id] = {**real, "saved_s": saved_s, "metric": None, "recorded": True}
        return e
    if not opts.on or v is None or v.kind not in CHANGES or v.meta.get("full") or not e.get("ok"):
        return e
    ref = prune.reference(state, v.parent, cache)
    if prune.waiting_reason(state, v.parent, ref) is not None:
        return e
    curve = progress.valid_curve(e.get("curve"))
    if ref is None or not curve:
        return e
    step = max(1, len(curve) // LOOKS)  # the loop, too, looks a few times per run
    for i in [*range(0, len(curve) - 1, step), len(curve) - 1]:
        verdict = prune.judge(opts, ref, curve[: i + 1], cfg.goal)
        if verdict is None:
            continue
        saved = round(max(0.0, curve[-1][0] - verdict.t), 3)
        rec = verdict.record(opts)
        found[v.id] = {**rec, "saved_s": saved, "metric": e.get("metric")}
        return {
            **e,
            "ok": False,
            "metric": None,
            "pruned": rec,
            "saved_s": saved,
            "reason": verdict.text(cfg.metric, opts.k),
        }
    return e


def summary(
    opts: prune.PruneOptions,
    found: dict[str, ReplayedPrune],
    best: float | None,
    best_unpruned: float | None,
    curves: int,
) -> PruningReplay:
    """The replay's word on pruning: which runs, the GPU time saved, whether the best moved."""
    return {
        "curves": curves,  # runs with a recorded curve: none, and the replay can stop nothing
        "rule": opts.rule,
        "grace": opts.grace,
        "k": opts.k,
        "would_prune": sorted(found),
        "runs": found,
        "gpu_saved_s": round(sum(float(r["saved_s"]) for r in found.values()), 1),
        "best": best,
        "best_unpruned": best_unpruned,
        "best_changed": best != best_unpruned,
    }
