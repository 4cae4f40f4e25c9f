"""The typed records of a run: queue states, attempt end kinds, the lease, attempt records and the
descriptor. Each has one JSON form (what today's code writes, so old run folders still open) and
no module but this one reads or writes their raw keys.

Why a :class:`Descriptor` is a typed view over its JSON object instead of a copy of it: a claim
and a commit happen once per task on the hot path, and the object read from disk is the object
written back (unknown keys a newer or older gpuswarm wrote ride along untouched). Wrapping costs
nothing; a copy in and out costs a conversion each way. Attempt records and leases are small
immutable values: frozen dataclasses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

from gpuswarm.core.errors import QueueError
from gpuswarm.core.records import descriptor_problem, parse_descriptor

DESCRIPTOR_VERSION = 1
LEASE_SEP = "@"


class State(str, Enum):
    """The queue folder a descriptor is in (and the ``state`` it records)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # ended without counting as a failure (skip_exit_code, exclude:)


class EndKind(str, Enum):
    """How an attempt ended (an attempt record's ``kind``)."""

    EXITED = "exited"
    SIGNALED = "signaled"
    TIMEOUT = "timeout"
    NOT_FOUND = "not-found"
    NOT_EXECUTABLE = "not-executable"
    CANCELLED = "cancelled"
    SPAWN_ERROR = "spawn-error"
    LOST = "lost"  # its supervisor died: the outcome is unknown
    ORPHAN = "orphan"  # its supervisor died, judged done by the completion file it left


class RecordError(QueueError, ValueError):
    """A record read back from disk is unusable; the message is the finding (``check``, the
    corrupt row of results) naming the field at fault."""


# -- the lease --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    """Who holds a running descriptor: in its file name, ``<name>@<owner>@<slot>.<claim>``.

    ``owner`` is ``host:pid:start``; ``slot`` the owner's slot index (-1: a reclaimer, no slot
    runs it); ``claim`` makes each claim's name unique (a claim counter, or for a reclaimer the
    checksum of the name the task was claimed under)."""

    owner: str
    slot: int
    claim: str = ""

    @classmethod
    def parse(cls, file_name: str) -> Lease | None:
        """The lease in a running file's name; None for a name without one."""
        parts = file_name.split(LEASE_SEP)
        if len(parts) != 3:
            return None
        slot, _, claim = parts[2].partition(".")
        try:
            return cls(parts[1], int(slot), claim)
        except ValueError:
            return None

    @property
    def suffix(self) -> str:
        """What a claim appends to the descriptor's name."""
        tail = f"{self.slot}.{self.claim}" if self.claim else str(self.slot)
        return f"{LEASE_SEP}{self.owner}{LEASE_SEP}{tail}"

    def file_name(self, base: str) -> str:
        return base + self.suffix

    @property
    def reclaimer(self) -> bool:
        return self.slot < 0

    @staticmethod
    def owner_mark(owner: str) -> str:
        """The part of every file name leased by ``owner`` (temp files of its writes too)."""
        return f"{LEASE_SEP}{owner}{LEASE_SEP}"


def base_name(file_name: str) -> str:
    """The descriptor name without a lease suffix."""
    return file_name.split(LEASE_SEP, 1)[0]


# -- attempt records --------------------------------------------------------------------------
_LAUNCHED_KEYS = ("returncode", "signal", "reason")  # written (null too) once it was launched


@dataclass(frozen=True)
class AttemptRecord:
    """One entry of a descriptor's ``attempts`` list.

    ``None`` means the key is absent from the JSON form, except that a launched attempt
    (``started`` set) always writes ``returncode``, ``signal`` and ``reason``, null or not.
    Built only by :meth:`launched`, :meth:`lost` and :meth:`orphan` (and :meth:`from_json`)."""

    n: int
    slot: str | None = None
    gpus: tuple[int, ...] | None = None
    started: float | None = None
    ended: float | None = None
    duration: float | None = None
    kind: str | None = None
    returncode: int | None = None
    signal: str | None = None
    reason: str | None = None
    oom: bool | None = None
    killed: int | None = None
    metrics: dict[str, Any] | None = None
    interrupted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know

    # constructors ------------------------------------------------------------------------
    @classmethod
    def launched(
        cls,
        *,
        n: int,
        slot: str,
        gpus: tuple[int, ...] | list[int],
        started: float,
        ended: float,
        duration: float,
        kind: EndKind | str,
        returncode: int | None,
        signal: str | None,
        reason: str | None,
        oom: bool,
        killed: int,
    ) -> AttemptRecord:
        """An attempt that ran (whatever its end); times rounded as every record has them."""
        return cls(
            n=n,
            slot=slot,
            gpus=tuple(gpus),
            started=round(started, 4),
            ended=round(ended, 4),
            duration=round(duration, 4),
            kind=EndKind(kind).value,
            returncode=returncode,
            signal=signal,
            reason=reason,
            oom=oom,
            killed=killed,
        )

    @classmethod
    def lost(
        cls, *, n: int, reason: str, slot: str | None = None, interrupted: bool = False
    ) -> AttemptRecord:
        """An attempt whose supervisor died: its outcome is unknown."""
        return cls(n=n, slot=slot, kind=EndKind.LOST.value, reason=reason, interrupted=interrupted)

    @classmethod
    def orphan(
        cls, *, n: int, slot: str, started: float, ended: float, reason: str
    ) -> AttemptRecord:
        """An attempt of a dead supervisor judged done by the completion file it left."""
        return cls(
            n=n,
            slot=slot,
            started=round(started, 4),
            ended=round(ended, 4),
            duration=round(max(0.0, ended - started), 4),
            kind=EndKind.ORPHAN.value,
            returncode=None,
            signal=None,
            reason=reason,
            oom=False,
            killed=0,
        )

    def but(self, **changes: Any) -> AttemptRecord:
        """A copy with ``changes`` (``interrupted=True``, ``reason=...``, ``metrics=...``)."""
        return replace(self, **changes)

    # reading -----------------------------------------------------------------------------
    @property
    def counted(self) -> bool:
        """Counts against ``max_attempts`` (an interrupted attempt does not)."""
        return not self.interrupted

    @property
    def seconds(self) -> float:
        return float(self.duration or 0)

    @property
    def end_kind(self) -> EndKind | None:
        try:
            return EndKind(self.kind) if self.kind is not None else None
        except ValueError:
            return None

    # JSON --------------------------------------------------------------------------------
    @classmethod
    def from_json(cls, obj: Any, where: str = "attempt") -> AttemptRecord:
        """The record of a JSON object checked as :func:`descriptor_problem` checks it."""
        if not isinstance(obj, dict):
            raise RecordError(f"{where} is {type(obj).__name__}, not dict")
        problem = descriptor_problem({"task": {}, "attempts": [obj]}, task_fields=False)
        if problem is not None:
            raise RecordError(problem.replace("attempts[0]", where, 1))
        return cls._of(obj)

    @classmethod
    def _of(cls, obj: dict[str, Any]) -> AttemptRecord:
        """From an already checked JSON object."""
        known = {k: obj[k] for k in _ATTEMPT_FIELDS if k in obj}
        gpus = known.get("gpus")
        if gpus is not None:
            known["gpus"] = tuple(gpus)
        if known.get("interrupted") is None:
            known.pop("interrupted", None)
        n = known.pop("n", 0)
        extra = {k: v for k, v in obj.items() if k not in _ATTEMPT_FIELDS}
        return cls(n=n, **known, extra=extra)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n}
        launched = self.started is not None
        for name in _ATTEMPT_FIELDS[1:]:
            value = getattr(self, name)
            if name == "interrupted":
                if value:
                    out[name] = True
            elif value is not None or (launched and name in _LAUNCHED_KEYS):
                out[name] = list(value) if name == "gpus" else value
        out.update(self.extra)
        return out


_ATTEMPT_FIELDS = tuple(f.name for f in fields(AttemptRecord) if f.name != "extra")


# -- the descriptor ---------------------------------------------------------------------------
class Descriptor:
    """A task in the queue: its spec (``task``), its attempts, its budget and where it stands.

    A typed view over the descriptor's JSON object (:attr:`raw`, the one form written to disk):
    every read and write of a descriptor goes through these properties."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    # construction ------------------------------------------------------------------------
    @classmethod
    def new(cls, task: dict[str, Any], seq: int) -> Descriptor:
        """A fresh pending descriptor of ``task`` (a TaskSpec dump), the ``seq``-th submitted."""
        return cls(
            {
                "v": DESCRIPTOR_VERSION,
                "id": task["id"],
                "seq": seq,
                "task": task,
                "attempts": [],
                "budget_from": 0,
                "interruptions": 0,
                "reason": None,
                "state": State.PENDING.value,
            }
        )

    @classmethod
    def from_json(cls, obj: Any, *, task_fields: bool = True) -> Descriptor:
        """The descriptor of a parsed JSON value; RecordError naming the finding when it is
        no descriptor (``attempts is str, not list``). ``task_fields=False`` leaves the task's
        own fields to the caller (a claim validates the whole task)."""
        problem = descriptor_problem(obj, task_fields=task_fields)
        if problem is not None:
            raise RecordError(problem)
        return cls(obj)

    @classmethod
    def parse(cls, raw: bytes) -> Descriptor:
        """The descriptor in a file's bytes; RecordError saying why not (empty, not JSON,
        mistyped), in the words :func:`parse_descriptor` uses."""
        data, problem = parse_descriptor(raw)
        if data is None:
            raise RecordError(problem or "unusable")
        return cls(data)

    @classmethod
    def loads(cls, raw: bytes, *, task_fields: bool = True) -> Descriptor:
        """Like :meth:`parse`, but a file that is no JSON raises json's own ValueError (a
        claim names the file it sets aside by that message)."""
        return cls.from_json(json.loads(raw), task_fields=task_fields)

    def to_json(self) -> dict[str, Any]:
        return self.raw

    # identity ----------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def has_id(self) -> bool:
        return "id" in self.raw

    def default_id(self, task_id: str) -> None:
        """Name a descriptor that lacks its id (hand-edited) by its file's task id."""
        self.raw.setdefault("id", task_id)

    @property
    def name(self) -> str:
        """The task's display name ("" when the spec has none)."""
        return str(self.task.get("name", ""))

    @property
    def seq(self) -> int:
        return int(self.raw.get("seq", 0))

    @property
    def task(self) -> dict[str, Any]:
        """The task spec's JSON form (a TaskSpec dump; config validates it)."""
        task: dict[str, Any] = self.raw["task"]
        return task

    @task.setter
    def task(self, spec: dict[str, Any]) -> None:
        self.raw["task"] = spec

    @property
    def priority(self) -> int:
        return int(self.task.get("priority", 0))

    @property
    def max_attempts(self) -> int:
        return int(self.task.get("max_attempts", 1))

    @property
    def skip_reason(self) -> str | None:
        why = self.task.get("skip_reason")
        return str(why) if why else None

    # where it stands ---------------------------------------------------------------------
    @property
    def state(self) -> str | None:
        """The recorded state (a :class:`State` value; in running/ the move it began)."""
        state = self.raw.get("state")
        return state if isinstance(state, str) else None

    @state.setter
    def state(self, state: State) -> None:
        self.raw["state"] = state.value

    @property
    def moved_from(self) -> str | None:
        """The leased name a begun move started from (recovery finishes that move)."""
        begun = self.raw.get("moved_from")
        return begun if isinstance(begun, str) else None

    @moved_from.setter
    def moved_from(self, name: str) -> None:
        self.raw["moved_from"] = name

    @property
    def reason(self) -> str | None:
        reason: str | None = self.raw.get("reason")
        return reason

    @reason.setter
    def reason(self, reason: str | None) -> None:
        self.raw["reason"] = reason

    @property
    def result(self) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.raw.get("result")
        return result

    @result.setter
    def result(self, result: dict[str, Any] | None) -> None:
        self.raw["result"] = result

    @property
    def retry_at(self) -> float | None:
        """When a failed attempt's backoff ends (set while it waits in running/)."""
        at = self.raw.get("retry_at")
        return float(at) if at is not None else None

    @retry_at.setter
    def retry_at(self, at: float | None) -> None:
        if at is None:
            self.raw.pop("retry_at", None)
        else:
            self.raw["retry_at"] = at

    def take_retry_at(self) -> float | None:
        """Clear the backoff mark and return what it was (None: it was not waiting)."""
        at = self.raw.pop("retry_at", None)
        return float(at) if at is not None else None

    # attempts ----------------------------------------------------------------------------
    @property
    def attempts(self) -> list[AttemptRecord]:
        """Every attempt so far, interrupted and earlier budgets' ones too (a copy)."""
        return [AttemptRecord._of(a) for a in self.raw.get("attempts", [])]

    @property
    def attempt_count(self) -> int:
        return len(self.raw.get("attempts", []))

    @property
    def next_attempt(self) -> int:
        """The number the next attempt gets (every recorded one, interrupted included, + 1)."""
        return self.attempt_count + 1

    def add_attempt(self, record: AttemptRecord) -> None:
        self.raw.setdefault("attempts", []).append(record.to_json())

    @property
    def counted_attempts(self) -> list[AttemptRecord]:
        """The attempts that were not interrupted, of every budget."""
        return [a for a in self.attempts if a.counted]

    @property
    def counted_count(self) -> int:
        """How many attempts were not interrupted, of every budget (no records built)."""
        return sum(1 for a in self.raw.get("attempts", []) if not a.get("interrupted"))

    @property
    def last_counted(self) -> AttemptRecord | None:
        counted = self.counted_attempts
        return counted[-1] if counted else None

    @property
    def last_attempt(self) -> AttemptRecord | None:
        attempts = self.raw.get("attempts") or []
        return AttemptRecord._of(attempts[-1]) if attempts else None

    @property
    def attempts_used(self) -> int:
        """Attempts that count against ``max_attempts`` (interrupted ones and earlier budgets
        don't)."""
        begin = int(self.raw.get("budget_from", 0))
        return sum(1 for a in self.raw["attempts"][begin:] if not a.get("interrupted"))

    @property
    def budget_from(self) -> int:
        return int(self.raw.get("budget_from", 0))

    @property
    def interruptions(self) -> int:
        return int(self.raw.get("interruptions", 0))

    def note_interrupted(self) -> None:
        """Count one more interruption (an attempt a stop or a crash cut short)."""
        self.raw["interruptions"] = self.interruptions + 1

    @property
    def busy_seconds(self) -> float:
        """Seconds of every attempt (retries and interrupted ones too)."""
        return sum(float(a.get("duration") or 0) for a in self.raw.get("attempts", []))

    # transitions' bookkeeping ------------------------------------------------------------
    def mark_skipped(self, reason: str) -> None:
        """Created skipped (an ``exclude:`` glob matched it): listed, never run."""
        self.raw["state"] = State.SKIPPED.value
        self.raw["reason"] = reason

    def fresh_budget(self) -> None:
        """A failed task retried: earlier attempts stop counting; marked as a begun retry."""
        self.raw["budget_from"] = self.attempt_count
        self.raw["reason"] = None
        self.raw["state"] = State.PENDING.value

    def __repr__(self) -> str:
        return f"Descriptor({self.raw!r})"


__all__ = [
    "DESCRIPTOR_VERSION",
    "LEASE_SEP",
    "AttemptRecord",
    "Descriptor",
    "EndKind",
    "Lease",
    "RecordError",
    "State",
    "base_name",
]
