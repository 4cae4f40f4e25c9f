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
from collections.abc import Callable, Mapping
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


#: ``finished`` says ``waiting`` for a failed attempt whose retry waits out its backoff in
#: running/ (the task is neither running nor pending on disk: its next attempt is not started).
WAITING = "waiting"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str_list(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


#: The checks for the annotations payload fields use (as written, ``from __future__`` strings).
_CHECKS: dict[str, Callable[[object], bool]] = {
    "str": lambda v: isinstance(v, str),
    "int": _is_int,
    "bool": lambda v: isinstance(v, bool),
    "float | None": lambda v: v is None or _is_num(v),
    "int | None": lambda v: v is None or _is_int(v),
    "str | None": lambda v: v is None or isinstance(v, str),
    "list[str]": _is_str_list,
}
_BASE = frozenset({"ts", "ev", "extra"})
_SPECS: dict[type, list[tuple[str, bool, Callable[[object], bool] | None]]] = {}


def _spec(cls: type) -> list[tuple[str, bool, Callable[[object], bool] | None]]:
    """(name, required, check) per field of a payload class (computed once: events are decoded
    on the supervisor's hot path, by its terminal reporter)."""
    found = _SPECS.get(cls)
    if found is None:
        found = [
            (
                f.name,
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                _CHECKS.get(str(f.type)),
            )
            for f in dataclasses.fields(cls)
            if f.name != "extra"
        ]
        _SPECS[cls] = found
    return found


@dataclass(frozen=True, kw_only=True)
class _Event:
    """Fields common to every event: when (unix seconds; None when the line had none) and any
    fields this version has no name for (kept, so ``to_json`` loses nothing)."""

    kind: ClassVar[Ev]
    ts: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Any:
        """The event of a journal line of this kind; None when a field is missing or mistyped."""
        values: dict[str, Any] = {}
        for name, required, check in _spec(cls):
            if name not in data:
                if required:
                    return None  # a field readers need
                continue
            value = data[name]
            if check is not None and not check(value):
                return None
            values[name] = float(value) if name == "ts" and value is not None else value
        extra = {k: v for k, v in data.items() if k not in values and k != "ev"}
        return cls(**values, extra=extra)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ts": self.ts, "ev": self.ev}
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


@dataclass(frozen=True, kw_only=True)
class SupervisorStarted(_Event):
    kind: ClassVar[Ev] = Ev.SUPERVISOR_STARTED
    slots: list[str] = field(default_factory=list)
    owner: str = ""
    pid: int | None = None


@dataclass(frozen=True, kw_only=True)
class Started(_Event):
    """An attempt of ``task`` began on ``slot``: its log is ``attempt-<attempt>/output.log``."""

    kind: ClassVar[Ev] = Ev.STARTED
    task: str
    attempt: int
    slot: str
    name: str = ""
    timeout: float | None = None


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
class Requeued(_Event):
    """Back to pending/ from ``frm`` (running, waiting, failed); a config change has no task
    and says how many tasks it ``added``."""

    kind: ClassVar[Ev] = Ev.REQUEUED
    task: str | None = None
    frm: str | None = None
    reason: str | None = None
    added: int | None = None


@dataclass(frozen=True, kw_only=True)
class Recovered(_Event):
    """A move to ``state`` that a crashed supervisor had begun, finished by a resume."""

    kind: ClassVar[Ev] = Ev.RECOVERED
    task: str | None = None
    state: str | None = None


@dataclass(frozen=True, kw_only=True)
class Quarantined(_Event):
    kind: ClassVar[Ev] = Ev.QUARANTINED
    slot: str
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Unquarantined(_Event):
    kind: ClassVar[Ev] = Ev.UNQUARANTINED
    slot: str
    reason: str | None = None
    probe: bool = False  # a probe: the slot claims one task to show it works again


@dataclass(frozen=True, kw_only=True)
class Shutdown(_Event):
    kind: ClassVar[Ev] = Ev.SHUTDOWN
    mode: str | None = None  # warm or cold


@dataclass(frozen=True, kw_only=True)
class Corrupt(_Event):
    kind: ClassVar[Ev] = Ev.CORRUPT
    task: str | None = None
    file: str | None = None
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class Other(_Event):
    """Any other kind (run_created, killed, aggregated, ...): only its name and fields."""

    kind: ClassVar[Ev] = Ev.JUDGED  # unused: ``ev`` is the line's own kind
    name: str = ""

    @property
    def ev(self) -> str:
        return self.name

    def to_json(self) -> dict[str, Any]:
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
    | Corrupt
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
        Corrupt,
    )
}


def decode(data: Mapping[str, Any]) -> Event | None:
    """The typed event of a parsed journal line; None for a line of the wrong shape."""
    kind = data.get("ev", "")  # (a line without a kind is an Other: nobody reads it)
    if not isinstance(kind, str):
        return None
    typ = _TYPES.get(kind)
    if typ is not None:
        event: Event | None = typ.from_json(data)
        return event
    ts = data.get("ts")
    if ts is not None and not _is_num(ts):
        return None
    extra = {k: v for k, v in data.items() if k not in ("ts", "ev")}
    return Other(ts=None if ts is None else float(ts), extra=extra, name=kind)
