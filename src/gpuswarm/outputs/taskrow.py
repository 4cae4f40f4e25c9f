"""A task's row of the outputs, typed (issue 32, step 6): results.tsv's fixed columns, the
entries of summary.json's ``failures``, ``skipped`` and ``cancelled`` lists, the report's task
table and the dashboard's task rows are its fields, read by name.

``TaskRow.to_json`` is the row by column (``FIXED_COLUMNS`` order, as results.tsv writes it);
``failure_json`` / ``apart_json`` are summary.json's entries; ``from_json`` reads any of them
back, older ones missing newer keys included (a missing cell reads as results.tsv writes an
absent one: ""). The last attempt's columns are ``ROW_FIELDS`` of its record (one list, in
``core/models/attempt.py``): a field added there is a column here without code of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from gpuswarm.core.models import AttemptRecord
from gpuswarm.core.models.attempt import ROW_FIELDS

#: results.tsv's fixed columns, in order (metrics, results and usage follow them)
FIXED_COLUMNS = (
    "task",
    "name",
    "state",
    "attempts",
    "gpus",
    "seconds",
    "exit",
    "reason",
    *ROW_FIELDS,  # the last attempt's, named in its record (core/models/attempt.py)
    "energy_j",  # issue 37: GPU energy of every attempt of the task ("": not measured)
    "energy_mode",  # exclusive, or shared (apportioned: docs/monitoring.md, "Energy")
)

Cell = str | int | float | bool  # a scalar cell ("" where not set)


class FailureJson(TypedDict):
    """An entry of summary.json's ``failures``: a task that did not end well."""

    task: str
    state: str
    reason: str


class ApartJson(TypedDict):
    """An entry of summary.json's ``skipped`` and ``cancelled``."""

    task: str
    reason: str


def last_fields(last: AttemptRecord | None) -> dict[str, object]:
    """The row's cells of the last attempt's fields (``ROW_FIELDS``): "" where not set."""
    if last is None:
        return dict.fromkeys(ROW_FIELDS, "")
    return {k: "" if (v := getattr(last, k)) is None else v for k in ROW_FIELDS}


def _text(value: object) -> str:
    """A text cell: ``str(value or "")`` (a missing key, null or false: "")."""
    return value if isinstance(value, str) else str(value) if value else ""


def _number(value: object) -> int | float | str:
    """A count or seconds cell: the number, "" where absent (or not a number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return ""


@dataclass(slots=True)  # one per task of a 100k-task run: no __dict__ each
class TaskRow:
    """A task's cells by column; ``redact_rows`` rewrites ``name`` and ``reason`` in place."""

    task: str = ""
    name: str = ""
    state: str = ""
    attempts: int | float | str = 0
    gpus: str = ""
    seconds: int | float | str = ""  # "" where its last attempt has no duration
    exit: str = ""
    reason: str = ""
    last: dict[str, object] = field(default_factory=lambda: last_fields(None))  # ROW_FIELDS
    energy_j: int | float | str = ""
    energy_mode: str = ""

    # reading by column name --------------------------------------------------------------
    def get(self, column: str, default: object = None) -> object:
        """The cell of ``column`` (a results.tsv column name), ``default`` for another name."""
        if column in self.last:
            return self.last[column]
        return getattr(self, column) if column in _OWN else default

    def __getitem__(self, column: str) -> object:
        if column in self.last or column in _OWN:
            return self.get(column)
        raise KeyError(column)

    def cells(self) -> list[object]:
        """The cells in ``FIXED_COLUMNS`` order (results.tsv's first columns)."""
        last = self.last
        return [
            *self._head(),
            *(last.get(k, "") for k in ROW_FIELDS),
            self.energy_j,
            self.energy_mode,
        ]

    def _head(self) -> tuple[object, ...]:
        return (
            self.task,
            self.name,
            self.state,
            self.attempts,
            self.gpus,
            self.seconds,
            self.exit,
            self.reason,
        )

    # JSON --------------------------------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        """The row by column, in ``FIXED_COLUMNS`` order."""
        return dict(zip(FIXED_COLUMNS, self.cells(), strict=True))

    def failure_json(self) -> FailureJson:
        return {"task": self.task, "state": self.state, "reason": self.reason}

    def apart_json(self) -> ApartJson:
        return {"task": self.task, "reason": self.reason}

    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> TaskRow:
        """A row (or a summary entry) read back: a missing key reads as an empty cell, a
        mistyped one as its text."""
        get = obj.get
        return cls(
            task=_text(get("task")),
            name=_text(get("name")),
            state=_text(get("state")),
            attempts=_number(get("attempts")) if "attempts" in obj else 0,
            gpus=_text(get("gpus")),
            seconds=_number(get("seconds")),
            exit=_text(get("exit")),
            reason=_text(get("reason")),
            last={k: "" if (v := get(k)) is None else v for k in ROW_FIELDS},
            energy_j=_number(get("energy_j")),
            energy_mode=_text(get("energy_mode")),
        )

    @classmethod
    def corrupt(cls, task: str, reason: str) -> TaskRow:
        """The row of a task whose descriptor cannot be used (counted, so nothing vanishes)."""
        return cls(task=task, state="corrupt", attempts=0, reason=reason)


_OWN = frozenset(FIXED_COLUMNS) - frozenset(ROW_FIELDS)
