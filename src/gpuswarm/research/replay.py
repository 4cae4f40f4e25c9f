"""Decisions recomputed from the ledger with other settings: ``research log --policy SPEC``.

A replay reads ``ledger.jsonl`` in order and feeds its events (variants created, runs finished,
rounds sealed) to the same :func:`policy.decide` the experiment uses, with the settings of
``SPEC`` instead of the experiment's, applying each decision in memory only: nothing is written,
queued or moved. Runs cannot be re-done, so where the replayed policy would want a run the
ledger lacks (a confirmation re-run, a re-based combination, a baseline on another platform,
paired: a run of the replayed BASE in a result's period) it says so and keeps nothing on its
strength, and a variant is assumed to measure on the replayed BASE what it measured on the
BASE it ran on (its parent becomes the replayed BASE of its time). BASE's control runs are
references, never BASE's metric (as in settle.py).
"""

from __future__ import annotations

import copy
import statistics

from pydantic import ValidationError

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import controls, entries, rules
from gpuswarm.research.configure import CHANGEABLE
from gpuswarm.research.entries import (
    BaseEntry,
    DecidedEntry,
    Entry,
    FinishedEntry,
    VariantEntry,
    metric_of,
)
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths
from gpuswarm.research.journal import ExperimentState, Variant, apply_event
from gpuswarm.research.payloads import Replay, ReplayedPrune, ReplayedVariant
from gpuswarm.research.policy import Decision, decide
from gpuswarm.research.prune import PruneOptions
from gpuswarm.research.prune_replay import replay_finished

POLICIES = ("greedy", "noise-aware", "manual")
# what the policy decided is not replayed: it is decided anew
_REPLAYED = ("init", "variant", "finished", "sealed", "mode", "controls")


def parse_spec(cfg: ExperimentConfig, spec: str) -> ExperimentConfig:
    """``greedy`` / ``noise-aware,noise_k=3,gain_per_line=0`` -> the settings to replay with."""
    changes: dict[str, str] = {}
    for i, part in enumerate(p.strip() for p in spec.split(",")):
        if not part:
            continue
        if "=" not in part:
            if i or part not in POLICIES:
                raise ResearchError(
                    f"--policy {spec!r}: {part!r} is neither a policy ({', '.join(POLICIES)}) "
                    "first nor a setting=value, e.g. --policy greedy or --policy "
                    "noise-aware,noise_k=3,gain_per_line=0"
                )
            changes["policy"] = part
            continue
        key, value = (x.strip() for x in part.split("=", 1))
        key = key.replace("-", "_")
        if key not in CHANGEABLE or key in ("command", "shell", "timeout", "link", "linger"):
            raise ResearchError(f"--policy {spec!r}: {key!r} is not a decision setting")
        changes[key] = value
    try:
        return ExperimentConfig.model_validate({**cfg.model_dump(), **changes})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise ResearchError(f"--policy {spec!r}: {where}: {msg}") from None


def replay_decisions(
    paths: ExpPaths, cfg: ExperimentConfig, pruning: PruneOptions | None = None
) -> Replay:
    """What ``cfg`` would have decided on this ledger: per variant the recorded and the
    replayed status and reason, and which variants each kept; with ``pruning`` (issue 38),
    what that rule would have stopped (``prune_replay.py``)."""
    pruning = pruning or PruneOptions()
    pruned: dict[str, ReplayedPrune] = {}
    curves: dict[str, list[list[float]]] = {}  # issue 38: recorded curves, read once
    state = ExperimentState()
    recorded: dict[str, DecidedEntry] = {}
    wanted: dict[str, str] = {}  # variant -> the run the replayed policy wanted and lacked
    for e in entries.read(paths.ledger):
        if e["ev"] == "decided":
            recorded[e["id"]] = e
            continue
        if e["ev"] not in _REPLAYED:
            continue
        if e["ev"] == "variant":
            if e["kind"] == "baseline" and state.base and e["commit"] != state.base:
                continue  # a baseline of a BASE this policy never kept measures nothing here
            e = _reparented(state, e)
        elif e["ev"] == "finished":
            e = _replayed_finished(paths, cfg, state, e, pruning, pruned, curves)
        apply_event(state, e)
        if e["ev"] in ("finished", "sealed", "variant"):
            _settle(cfg, state, wanted)
    _settle(cfg, state, wanted, final=True)
    rows: list[ReplayedVariant] = []
    for v in state.variants.values():
        rec: DecidedEntry = recorded.get(v.id) or {}
        dec: DecidedEntry = v.decision or {}
        rows.append(
            {
                "id": v.id,
                "kind": v.kind,
                "description": v.description,
                "metric": (v.finished or {}).get("metric"),
                "platform": rules.platform_of(v),
                "recorded": rec.get("status"),
                "recorded_reason": rec.get("reason"),
                "replayed": dec.get("status") or ("wanted" if v.id in wanted else None),
                "replayed_reason": dec.get("reason") or wanted.get(v.id),
            }
        )
    changes = [r for r in rows if r["kind"] in ("variant", "combo")]  # not baselines, re-runs
    kept = [r["id"] for r in changes if r["recorded"] == "keep"]
    would = [r["id"] for r in changes if r["replayed"] == "keep"]
    return {
        "policy": {k: getattr(cfg, k) for k in ("policy", "noise_k", "confirm", *_rule_keys())},
        "variants": rows,
        "kept": kept,
        "would_keep": would,
        "best": state.best,
        "noise": rules.noise_view(state),
        "pruned": pruned,  # issue 38: id -> where the replayed rule stopped it
    }


def _rule_keys() -> tuple[str, ...]:
    from gpuswarm.research.configure import RULES

    return RULES


def _reparented(state: ExperimentState, e: VariantEntry) -> VariantEntry:
    """A variant of the recorded BASE of its time is one of the replayed BASE of its time."""
    e = e.copy()
    if state.base and e["kind"] in ("variant", "combo"):
        e["parent"] = state.base
    return e


def _replayed_finished(
    paths: ExpPaths,
    cfg: ExperimentConfig,
    state: ExperimentState,
    e: FinishedEntry,
    pruning: PruneOptions,
    pruned: dict[str, ReplayedPrune],
    curves: dict[str, list[list[float]]],
) -> Entry:
    """The ``finished`` line ``e`` as it would read with ``pruning`` (``prune_replay.py``)."""
    out = replay_finished(cfg, state, e, pruning, pruned, curves)
    return entries.parse(dict(out), str(paths.ledger)) or e


def _settle(
    cfg: ExperimentConfig, state: ExperimentState, wanted: dict[str, str], final: bool = False
) -> None:
    """Apply what ``cfg`` decides now, in memory, until nothing more is decided."""
    for _ in range(10_000):  # each pass decides something or stops; bounded against a bug
        decisions = decide(cfg, state)
        progressed = False
        for d in decisions:
            progressed |= _apply_in_memory(cfg, state, d, wanted)
        if not progressed:
            break
    if final:
        for v in state.undecided():
            if v.finished is not None and v.id not in wanted:
                wanted[v.id] = _undecided(state, v)


def _undecided(state: ExperimentState, v: Variant) -> str:
    """Why a finished run is undecided at the end of the replay."""
    if controls.waits_for_control(state, v):  # paired, and the replayed BASE never ran then
        return (
            f"paired: the ledger has no run of the replayed BASE {state.base[:7]} of its "
            "period (a control run would be queued): not kept"
        )
    return "undecided at the end of the ledger"


def _apply_in_memory(
    cfg: ExperimentConfig, state: ExperimentState, d: Decision, wanted: dict[str, str]
) -> bool:
    v = state.variants[d.id]
    if d.status == "confirm":
        if rules.confirmations(state, v):  # the ledger has re-runs of it: they are judged
            return False
        wanted[v.id] = f"{d.reason} (the ledger has no re-runs of it: not kept)"
        v.decision = {"status": "discard", "reason": wanted[v.id]}
        return True
    if d.status == "rebase":
        wanted[v.id] = f"{d.reason}: would be re-based and run again (not in the ledger)"
        v.decision = {"status": "discard", "reason": wanted[v.id]}
        return True
    event: DecidedEntry = {"ev": "decided", "id": v.id, "status": d.status, "reason": d.reason}
    if d.status == "keep" and v.kind not in ("confirm", "control") and v.finished is not None:
        if v.kind == "baseline":
            runs = [*state.baselines.get(v.commit, []), metric_of(v.finished)]
            value = statistics.fmean(runs)
        else:
            value = d.metric if d.metric is not None else metric_of(v.finished)
        event["base_metric"] = {"commit": v.commit, "value": value}
    apply_event(state, copy.deepcopy(event))
    if d.status == "keep" and v.kind in ("variant", "combo"):
        moved: BaseEntry = {"ev": "base", "from": state.base, "to": v.commit, "id": v.id}
        apply_event(state, moved)
    return True
