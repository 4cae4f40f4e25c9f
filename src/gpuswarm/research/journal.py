"""The experiment's journal (``ledger.jsonl``, one fsynced JSON line per event) and its replay
into a :class:`ExperimentState`: the variants, their results and decisions, BASE, the rounds.
Everything the experiment knows is re-made from these lines, so a crash loses nothing journaled.
The lines' types, their parse and their JSON live in ``entries.py``."""

from __future__ import annotations

import os
import time
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from gpuswarm.research import entries
from gpuswarm.research.entries import (
    DecidedEntry,
    Entry,
    FinishedEntry,
    PrunedEntry,
    ResultRow,
    VariantEntry,
    VariantMeta,
)
from gpuswarm.research.experiment import ExpPaths
from gpuswarm.research.payloads import VariantView


@overload
def append(paths: ExpPaths, ev: Literal["variant"], **fields: Any) -> VariantEntry: ...
@overload
def append(paths: ExpPaths, ev: Literal["finished"], **fields: Any) -> FinishedEntry: ...
@overload
def append(paths: ExpPaths, ev: Literal["decided"], **fields: Any) -> DecidedEntry: ...
@overload
def append(paths: ExpPaths, ev: Literal["pruned"], **fields: Any) -> PrunedEntry: ...
@overload
def append(paths: ExpPaths, ev: str, **fields: Any) -> Entry: ...
def append(paths: ExpPaths, ev: str, **fields: Any) -> Entry:
    """Append one event line and fsync it (decisions must survive a crash right after): the
    entry ``entries.parse`` makes of it (a line it would refuse is never written)."""
    entry = entries.parse({"ts": round(time.time(), 3), "ev": ev, **fields}, str(paths.ledger))
    if entry is None:
        raise ValueError(f"no journal entry kind {ev!r}")  # pragma: no cover - a bug of ours
    line = entries.to_json(entry)
    fd = os.open(paths.ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


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
    finished: FinishedEntry | None = None
    decision: DecidedEntry | None = None
    seen: bool = False  # its result was shown by `research wait`
    meta: VariantMeta = field(default_factory=VariantMeta)  # the proposer's notes (digest, ...)
    mode: str = ""  # the experiment's mode when it was made (rounds | async)
    pruned: PrunedEntry | None = None  # issue 38: the loop stopped it early (prune.py)

    @property
    def status(self) -> str:
        if self.decision is not None:
            return self.decision["status"]
        return "finished" if self.finished is not None else "queued"

    def view(self) -> VariantView:
        fin: FinishedEntry = self.finished or {}
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
            "reason": (self.decision or {"status": ""}).get("reason") or fin.get("reason"),
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

    def results(self) -> list[ResultRow]:
        """results.tsv's rows in the order they were decided, each read by column."""
        return [ResultRow.of(row) for row in self.rows]

    def next_id(self) -> str:
        return f"v{len(self.variants) + 1:04d}"

    def in_flight(self) -> list[Variant]:
        return [v for v in self.variants.values() if v.finished is None]

    def undecided(self) -> list[Variant]:
        return [v for v in self.variants.values() if v.decision is None]


def replay(paths: ExpPaths) -> ExperimentState:
    state = ExperimentState()
    for e in entries.read(paths.ledger):
        apply_event(state, e)
    return state


def apply_event(state: ExperimentState, e: Entry) -> None:
    """Fold one typed entry into ``state`` (a kind replay does not fold is left alone)."""
    if e["ev"] == "variant":
        _on_variant(state, e)
    elif e["ev"] == "finished":
        if e["id"] in state.variants:
            state.variants[e["id"]].finished = e
    elif e["ev"] == "decided":
        _on_decided(state, e)
    elif e["ev"] == "pruned":
        v = state.variants.get(e["id"])
        if v is not None and v.finished is None:  # a stop that came after the run ended is moot
            v.pruned = e
    elif e["ev"] == "seen":
        for vid in e["ids"]:
            if vid in state.variants:
                state.variants[vid].seen = True
    else:
        _on_experiment(state, e)


def _on_experiment(state: ExperimentState, e: Entry) -> None:
    """The lines about the experiment as a whole: BASE, the rounds, its mode and controls."""
    if e["ev"] == "init":
        state.base = state.worktree_base = e["base"]
        if isinstance(models := e.get("gpu_models"), dict):
            state.gpu_models = {str(k): int(n) for k, n in models.items()}
    elif e["ev"] == "base":
        state.base = e["to"]
        state.pending_base = None
    elif e["ev"] == "worktree":
        state.worktree_base = e["base"]
    elif e["ev"] == "sealed":
        state.sealed.add(int(e["n"]))
        state.round = max(state.round, int(e["n"]) + 1)
    elif e["ev"] == "mode":
        state.mode = e["mode"]
    elif e["ev"] == "controls":
        state.paired = bool(e.get("paired", True))


def _on_variant(state: ExperimentState, e: VariantEntry) -> None:
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


def _on_decided(state: ExperimentState, e: DecidedEntry) -> None:
    v = state.variants.get(e["id"])
    if v is None:
        return
    drop_row(state, v)  # decided again (a keep by hand of a discard): the new row replaces it
    v.decision = e
    if row := e.get("row"):  # a withdrawn variant measured nothing: no row
        state.rows.append(list(row))
        state.row_ids.append(v.id)
    if (base_metric := e.get("base_metric")) is not None:
        state.base_metric[base_metric["commit"]] = float(base_metric["value"])
    if v.kind == "baseline" and e["status"] == "keep" and v.finished:
        state.baselines.setdefault(v.commit, []).append(entries.metric_of(v.finished))
    if e["status"] == "keep" and v.kind in ("variant", "combo"):
        state.pending_base = BaseMove(frm=state.base, to=v.commit, id=v.id)
