"""The journal's events as types: their kinds, one typed payload per kind, and :func:`decode`.

A journal line (events.jsonl) is ``{"ts": ..., "ev": <kind>, <fields>}``. :func:`decode` turns a
parsed line into a typed event, or None when the line is of the wrong shape (a field a reader
needs is missing or mistyped): every reader skips such a line, as ``records.parse_event`` does
for lines that are no event object. Kinds without a payload class of their own (and kinds a later
gpuswarm may add) decode to :class:`Other`, so old and new journals both open. ``to_json`` gives
each event back in the one JSON form the journal holds (unknown fields are kept).

The one reducer of these events, :class:`~gpuswarm.core.runview.RunView`, lives beside this
module; producers still write through ``store.ledger.Ledger.emit(Ev.X, ...)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar


class Ev(str, Enum):
    RUN_CREATED = "run_created"
    SUPERVISOR_STARTED = "supervisor_started"
    SUPERVISOR_STOPPED = "supervisor_stopped"
    STARTED = "started"
    FINISHED = "finished"  # an attempt ended (fields: state it led to, reason)
    REQUEUED = "requeued"  # back to pending (retry, interrupted, resume)
    RECOVERED = "recovered"  # a move a crashed supervisor had begun, completed on resume
    KILLED = "killed"  # leftover processes of a crashed supervisor's attempts, killed on resume
    CORRUPT = "corrupt"
    QUARANTINED = "quarantined"  # a slot stopped claiming: its attempts kept failing fast
    SHUTDOWN = "shutdown"  # warm or cold shutdown requested
    LEASE_LOST = "lease_lost"  # a reclaimer took a task from a stalled supervisor: not committed
    AGGREGATED = "aggregated"
    STALE_RESULT = "stale_result"  # a completion file found before an attempt, moved aside
    UNQUARANTINED = "unquarantined"  # a quarantined slot back in rotation (probe or by hand)
    PREFLIGHT = "preflight"  # a slot's preflight commands: ok, or the failure that stopped it
    AFTER_ALL = "after_all"  # the after_all step ran: exit code, output file
    JUDGED = "judged"  # an interrupted attempt judged by what it left (exit 0 / completion file)
    CONTROL = "control"  # a person's request (cancel, retry, pause, priority, add) applied
    ADDED = "added"  # tasks appended to a run (gpuswarm add)
    ENQUEUED = "enqueued"  # a streamed enqueue ended: every task of the new run is in the queue
    SLOTS = "slots"  # a cluster's node joined (its slots added) or left (retired): backend ray
    # issue 19: an ended attempt's processes still hold its GPU past the release wait (gpu,
    # task, attempt, pids, mb, reason): the GPU is skipped until ``gpu_freed``
    GPU_HELD = "gpu_held"
    GPU_FREED = "gpu_freed"
    GPU_WAIT = "gpu_wait"  # the first task in line fits no GPU now (task, need_mb, room_mb)
    HALTED = "halted"  # issue 28: the halt rule was met (spec, when, count, reason)
    # issue 35: a task waiting for prerequisites moved (task, frm, state, reason, after): ended
    # dependency_failed / skipped, or back to blocked/ (its failed prerequisite was retried);
    # its release to pending/ is a ``requeued`` (frm blocked)
    DEPENDENCY = "dependency"
    BUDGET = "budget"  # issue 34: the run's budget was crossed (reason, how), or a note
    STALLED = "stalled"  # issue 34: an attempt did nothing for stall_after (task, reason)


#: ``finished`` says ``waiting`` for a failed attempt whose retry waits out its backoff in
#: running/ (the task is neither running nor pending on disk: its next attempt is not started).
WAITING = "waiting"


_NONE = type(None)
#: Per annotation of a payload field (as written: ``from __future__`` strings): the types a
#: value may have, and whether a bool passes (a bool is an int to ``isinstance``).
_CHECKS: dict[str, tuple[tuple[type, ...], bool]] = {
    "str": ((str,), False),
    "int": ((int,), False),
    "bool": ((bool,), True),
    "float | None": ((int, float, _NONE), False),
    "int | None": ((int, _NONE), False),
    "bool | None": ((bool, _NONE), True),
    "str | None": ((str, _NONE), False),
    "list[str]": ((list,), False),
}
_BASE = frozenset({"ts", "ev", "extra"})


#: (name, required, allowed types or None for any, whether a bool passes) per payload field
_Field = tuple[str, bool, "tuple[type, ...] | None", bool]
_SPECS: dict[type, tuple[tuple[_Field, ...], frozenset[str]]] = {}
_ABSENT = object()


def _spec(cls: type) -> tuple[tuple[_Field, ...], frozenset[str]]:
    """The fields of a payload class and their checks, and the names it knows (computed once:
    events are decoded on the supervisor's hot path, by its terminal reporter)."""
    found = _SPECS.get(cls)
    if found is None:
        specs: list[_Field] = []
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            types, bool_ok = _CHECKS.get(str(f.type), (None, True))
            specs.append((f.name, required, types, bool_ok))
        found = (tuple(specs), frozenset({"ev", *(f[0] for f in specs)}))
        _SPECS[cls] = found
    return found


def _fits(value: Any, types: tuple[type, ...], bool_ok: bool) -> bool:
    if isinstance(value, list):  # list[str], the only list a payload has
        return list in types and all(isinstance(x, str) for x in value)
    return isinstance(value, types) and (bool_ok or value.__class__ is not bool)


@dataclass(kw_only=True, slots=True)
class _Event:
    """Fields common to every event: when (unix seconds; None when the line had none) and any
    fields this version has no name for (kept, so ``to_json`` loses nothing)."""

    kind: ClassVar[Ev]
    ts: float | None = None
    extra: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Any:
        """The event of a journal line of this kind; None when a field is missing or mistyped."""
        specs, known = _spec(cls)
        values: dict[str, Any] = {}  # the payload's keywords, each checked against its field
        for name, required, types, bool_ok in specs:
            value = data.get(name, _ABSENT)
            if value is _ABSENT:
                if required:
                    return None  # a field readers need
                continue
            if types is not None and not _fits(value, types, bool_ok):
                return None
            values[name] = value
        if values.get("ts") is not None:
            values["ts"] = float(values["ts"])
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**values, extra=extra)

    @classmethod
    def from_own(cls, data: Mapping[str, Any]) -> Any:
        """An event this process just emitted (``Ledger.emit``'s record, handed to listeners):
        its fields are ours, so they are taken as they are; None if a needed one is missing."""
        _, known = _spec(cls)
        values: dict[str, Any] = {}  # the payload's keywords, as this process emitted them
        extra: dict[str, object] = {}
        for k, v in data.items():
            if k not in known:
                extra[k] = v
            elif k != "ev":
                values[k] = v
        try:
            return cls(**values, extra=extra)
        except TypeError:
            return None

    def to_json(self) -> dict[str, object]:
        """The journal line: ``ts``, ``ev``, the fields that are set, then the fields this
        version has no name for (any JSON: readers narrow what they take)."""
        out: dict[str, object] = {"ts": self.ts, "ev": self.ev}
        for f in dataclasses.fields(self):
            if f.name not in _BASE and getattr(self, f.name) is not None:
                out[f.name] = getattr(self, f.name)
        out.update(self.extra)
        if self.ts is None:
            del out["ts"]
        return out

    @property
    def ev(self) -> str:
        return self.kind.value


@dataclass(kw_only=True, slots=True)
class SupervisorStarted(_Event):
    kind: ClassVar[Ev] = Ev.SUPERVISOR_STARTED
    slots: list[str] = field(default_factory=list)
    owner: str = ""
    pid: int | None = None


@dataclass(kw_only=True, slots=True)
class Started(_Event):
    """An attempt of ``task`` began on ``slot``: its log is ``attempt-<attempt>/output.log``."""

    kind: ClassVar[Ev] = Ev.STARTED
    task: str
    attempt: int
    slot: str
    name: str = ""
    timeout: float | None = None


@dataclass(kw_only=True, slots=True)
class Finished(_Event):
    """An attempt ended; ``state`` is where it led (done, failed, skipped, pending: retried at
    once, waiting: retried after a backoff)."""

    kind: ClassVar[Ev] = Ev.FINISHED
    task: str
    slot: str
    attempt: int | None = None
    state: str | None = None
    reason: str | None = None
    seconds: float | None = None
    retry: bool = False
    retry_in: float | None = None
    max_attempts: int | None = None
    used: int | None = None  # attempts of the current budget
    # issue 34: what the attempt's agent spent (absent: it reported no usage); cost_usd None
    # with tokens: its cost is unknown
    tokens: int | None = None
    cost_usd: float | None = None
    cost_unknown: bool | None = None


@dataclass(kw_only=True, slots=True)
class Requeued(_Event):
    """Back to pending/ from ``frm`` (running, waiting, failed); a config change has no task
    and says how many tasks it ``added``."""

    kind: ClassVar[Ev] = Ev.REQUEUED
    task: str | None = None
    frm: str | None = None
    reason: str | None = None
    added: int | None = None


@dataclass(kw_only=True, slots=True)
class Recovered(_Event):
    """A move to ``state`` that a crashed supervisor had begun, finished by a resume."""

    kind: ClassVar[Ev] = Ev.RECOVERED
    task: str | None = None
    state: str | None = None


@dataclass(kw_only=True, slots=True)
class Quarantined(_Event):
    kind: ClassVar[Ev] = Ev.QUARANTINED
    slot: str
    reason: str | None = None


@dataclass(kw_only=True, slots=True)
class Unquarantined(_Event):
    kind: ClassVar[Ev] = Ev.UNQUARANTINED
    slot: str
    reason: str | None = None
    probe: bool = False  # a probe: the slot claims one task to show it works again


@dataclass(kw_only=True, slots=True)
class Slots(_Event):
    """A cluster's slots changed (backend ray): a node ``joined`` (its slots added), ``left``
    or had a slot ``retired`` (gone), or an attempt of a dead driver was ``adopted``."""

    kind: ClassVar[Ev] = Ev.SLOTS
    change: str
    slots: list[str] = field(default_factory=list)
    host: str | None = None
    node: str | None = None


@dataclass(kw_only=True, slots=True)
class Shutdown(_Event):
    kind: ClassVar[Ev] = Ev.SHUTDOWN
    mode: str | None = None  # warm or cold


@dataclass(kw_only=True, slots=True)
class Corrupt(_Event):
    kind: ClassVar[Ev] = Ev.CORRUPT
    task: str | None = None
    file: str | None = None
    reason: str | None = None


@dataclass(kw_only=True, slots=True)
class Control(_Event):
    """A person's request applied: ``request`` (cancel, retry, pause, unpause, priority) of
    ``task`` (or ``slot``; neither: the whole run), asked by ``by``, applied by ``applied_by``
    (a supervisor's owner id, or the asking command itself when no supervisor was needed).
    A request dropped unapplied (its attempt ended first) names why in ``dropped`` and moves
    nothing (no ``state``)."""

    kind: ClassVar[Ev] = Ev.CONTROL
    request: str
    task: str | None = None
    slot: str | None = None
    by: str | None = None
    applied_by: str | None = None
    state: str | None = None  # where the task went (cancelled, pending)
    priority: int | None = None
    attempt: int | None = None  # the attempt a cancel was made for (when it said)
    dropped: str | None = None  # a request that did not apply, dropped: why (too late, retry)


@dataclass(kw_only=True, slots=True)
class Other(_Event):
    """Any other kind (run_created, killed, aggregated, ...): only its name and fields."""

    kind: ClassVar[Ev] = Ev.JUDGED  # unused: ``ev`` is the line's own kind
    name: str = ""

    @property
    def ev(self) -> str:
        return self.name

    def to_json(self) -> dict[str, object]:
        out = {"ts": self.ts, "ev": self.name, **self.extra}
        if self.ts is None:
            del out["ts"]
        return out


Event = (
    SupervisorStarted
    | Started
    | Finished
    | Requeued
    | Recovered
    | Quarantined
    | Unquarantined
    | Shutdown
    | Slots
    | Corrupt
    | Control
    | Other
)
_TYPES: dict[str, type[_Event]] = {
    t.kind.value: t
    for t in (
        SupervisorStarted,
        Started,
        Finished,
        Requeued,
        Recovered,
        Quarantined,
        Unquarantined,
        Shutdown,
        Slots,
        Corrupt,
        Control,
    )
}


def kind_of(data: Mapping[str, Any]) -> str:
    """A journal line's kind (``started``, ``slots``, ...); "" for a line without one."""
    kind = data.get("ev")
    return kind if isinstance(kind, str) else ""


def decode(data: Mapping[str, Any], *, own: bool = False) -> Event | None:
    """The typed event of a parsed journal line; None for a line of the wrong shape. ``own``:
    a record this process emitted (a ledger listener's): not checked field by field (the
    terminal reporter decodes on the supervisor's hot path)."""
    kind = data.get("ev", "")  # (a line without a kind is an Other: nobody reads it)
    if not isinstance(kind, str):
        return None
    typ = _TYPES.get(kind)
    if typ is not None:
        event: Event | None = typ.from_own(data) if own else typ.from_json(data)
        return event
    ts = data.get("ts")
    if ts is not None and (not isinstance(ts, (int, float)) or isinstance(ts, bool)):
        return None
    extra = {k: v for k, v in data.items() if k not in ("ts", "ev")}
    return Other(ts=None if ts is None else float(ts), extra=extra, name=kind)
