"""The experiment's journal (``ledger.jsonl``, one fsynced JSON line per event) and its replay
into a :class:`ExperimentState`: the variants, their results and decisions, BASE, the rounds.
Everything the experiment knows is re-made from these lines, so a crash loses nothing journaled."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import Any

from gpuswarm.app import api
from gpuswarm.research.experiment import ExpPaths


def append(paths: ExpPaths, ev: str, **fields: Any) -> dict[str, Any]:
    """Append one event line and fsync it (decisions must survive a crash right after)."""
    record: dict[str, Any] = {"ts": round(time.time(), 3), "ev": ev, **fields}
    line = json.dumps(record, default=str, separators=(",", ":")).encode() + b"\n"
    fd = os.open(paths.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return record


@dataclass
class Variant:
    id: str
    kind: str  # variant | baseline | combo | confirm
    commit: str
    parent: str
    description: str
    round: int
    source: str
    created: float
    origin: str | None = None  # the variant a combo re-bases
    finished: dict[str, Any] | None = None
    decision: dict[str, Any] | None = None
    seen: bool = False  # its result was shown by `research wait`
    meta: dict[str, Any] = field(default_factory=dict)  # the proposer's notes (digest, ...)
    mode: str = ""  # the experiment's mode when it was made (rounds | async)
    pruned: dict[str, Any] | None = None  # issue 38: the loop stopped it early (prune.py)

    @property
    def status(self) -> str:
        if self.decision is not None:
            return str(self.decision["status"])
        return "finished" if self.finished is not None else "queued"

    def view(self) -> dict[str, Any]:
        fin = self.finished or {}
        return {
            "id": self.id,
            "kind": self.kind,
            "commit": self.commit,
            "parent": self.parent,
            "description": self.description,
            "round": self.round,
            "status": self.status,
            "metric": fin.get("metric"),
            "memory_gb": fin.get("memory_gb"),
            "gpu": fin.get("gpu"),
            "seconds": fin.get("seconds"),
            "reason": (self.decision or {}).get("reason") or fin.get("reason"),
            "log": fin.get("log"),
            "log_path": fin.get("log_path"),
        }


@dataclass(frozen=True)
class BaseMove:
    """A keep's move of the branch from BASE to its commit, decided but not yet journaled as
    done (its ``base`` line): a crash between the two is finished by ``settle``."""

    frm: str
    to: str
    id: str


@dataclass
class ExperimentState:
    base: str = ""
    variants: dict[str, Variant] = field(default_factory=dict)
    base_metric: dict[str, float] = field(default_factory=dict)  # commit -> its measured metric
    baselines: dict[str, list[float]] = field(default_factory=dict)  # commit -> repeats
    rows: list[list[str]] = field(default_factory=list)
    row_ids: list[str] = field(default_factory=list)  # the variant of each row
    round: int = 1  # the open round: new variants join it until it is sealed
    sealed: set[int] = field(default_factory=set)
    mode: str = "rounds"
    worktree_base: str = ""
    pending_base: BaseMove | None = None  # a keep whose branch move is not journaled yet
    gpu_models: dict[str, int] = field(default_factory=dict)  # at init: model -> GPU count
    paired: bool = False  # decisions are paired with BASE control runs (a loop turned it on)

    @property
    def best(self) -> float | None:
        return self.base_metric.get(self.base)

    def rows_in_order(self, only: Container[str] | None = None) -> list[list[str]]:
        """results.tsv's rows in experiment order (the variants' order, as the seed's file
        is), not in the order they were decided (async: whichever finished first); ``only``:
        the rows of those variants."""
        order = {vid: n for n, vid in enumerate(self.variants)}
        pairs = sorted(
            zip(self.row_ids, self.rows, strict=False),
            key=lambda p: order.get(p[0], len(order)),
        )
        return [row for vid, row in pairs if only is None or vid in only]

    def next_id(self) -> str:
        return f"v{len(self.variants) + 1:04d}"

    def in_flight(self) -> list[Variant]:
        return [v for v in self.variants.values() if v.finished is None]

    def undecided(self) -> list[Variant]:
        return [v for v in self.variants.values() if v.decision is None]


def replay(paths: ExpPaths) -> ExperimentState:
    state = ExperimentState()
    for e in api.read_journal(paths.ledger):
        apply_event(state, e)
    return state


def apply_event(state: ExperimentState, e: dict[str, Any]) -> None:
    handler = _HANDLERS.get(str(e.get("ev")))
    if handler is not None:
        handler(state, e)


def _on_init(state: ExperimentState, e: dict[str, Any]) -> None:
    state.base = state.worktree_base = e["base"]
    models = e.get("gpu_models")
    if isinstance(models, dict):
        state.gpu_models = {str(k): int(n) for k, n in models.items()}


def _on_variant(state: ExperimentState, e: dict[str, Any]) -> None:
    state.variants[e["id"]] = Variant(
        id=e["id"],
        kind=e["kind"],
        commit=e["commit"],
        parent=e["parent"],
        description=e["description"],
        round=int(e.get("round", 0)),
        source=e.get("source", "manual"),
        created=float(e["ts"]),
        origin=e.get("origin"),
        meta=e.get("meta") or {},
        mode=state.mode,
    )


def _on_finished(state: ExperimentState, e: dict[str, Any]) -> None:
    if e["id"] in state.variants:
        state.variants[e["id"]].finished = e


def drop_row(state: ExperimentState, v: Variant) -> None:
    """Forget ``v``'s decision and its results.tsv row (a manual keep overrides a discard: one
    variant, one row)."""
    if v.decision is not None:
        row = list(v.decision.get("row") or [])
        for i in range(len(state.rows) - 1, -1, -1):
            if state.rows[i] == row:
                del state.rows[i]
                if i < len(state.row_ids):
                    del state.row_ids[i]
                break
    v.decision = None


def _on_decided(state: ExperimentState, e: dict[str, Any]) -> None:
    v = state.variants.get(e["id"])
    if v is None:
        return
    drop_row(state, v)  # decided again (a keep by hand of a discard): the new row replaces it
    v.decision = e
    if e.get("row"):  # a withdrawn variant measured nothing: no row
        state.rows.append(list(e["row"]))
        state.row_ids.append(v.id)
    if e.get("base_metric") is not None:
        state.base_metric[e["base_metric"]["commit"]] = float(e["base_metric"]["value"])
    if v.kind == "baseline" and e["status"] == "keep" and v.finished:
        state.baselines.setdefault(v.commit, []).append(float(v.finished["metric"]))
    if e["status"] == "keep" and v.kind in ("variant", "combo"):
        state.pending_base = BaseMove(frm=state.base, to=v.commit, id=v.id)


def _on_base(state: ExperimentState, e: dict[str, Any]) -> None:
    state.base = e["to"]
    state.pending_base = None


def _on_worktree(state: ExperimentState, e: dict[str, Any]) -> None:
    state.worktree_base = e["base"]


def _on_seen(state: ExperimentState, e: dict[str, Any]) -> None:
    for vid in e["ids"]:
        if vid in state.variants:
            state.variants[vid].seen = True


def _on_sealed(state: ExperimentState, e: dict[str, Any]) -> None:
    state.sealed.add(int(e["n"]))
    state.round = max(state.round, int(e["n"]) + 1)


def _on_mode(state: ExperimentState, e: dict[str, Any]) -> None:
    state.mode = e["mode"]


def _on_controls(state: ExperimentState, e: dict[str, Any]) -> None:
    state.paired = bool(e.get("paired", True))


def _on_pruned(state: ExperimentState, e: dict[str, Any]) -> None:
    v = state.variants.get(e["id"])
    if v is not None and v.finished is None:  # a stop that came after the run ended is moot
        v.pruned = e


_HANDLERS: dict[str, Callable[[ExperimentState, dict[str, Any]], None]] = {
    "init": _on_init,
    "variant": _on_variant,
    "finished": _on_finished,
    "decided": _on_decided,
    "base": _on_base,
    "worktree": _on_worktree,
    "seen": _on_seen,
    "sealed": _on_sealed,
    "mode": _on_mode,
    "controls": _on_controls,
    "pruned": _on_pruned,
}
