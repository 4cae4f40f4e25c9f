"""A results row (:class:`Row`) and the row of a task not yet attempted: the types the
outputs build (:mod:`gpuswarm.outputs.results` reads them off the queue)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuswarm.core.models import AttemptRecord, Descriptor, State
from gpuswarm.outputs.passk import RepeatOf, repeat_of
from gpuswarm.outputs.spend import TaskSpend, task_spend
from gpuswarm.outputs.taskrow import TaskRow, last_fields

EMPTY: dict[str, Any] = {}  # shared by rows without metrics or result; rows are read-only


@dataclass(slots=True)  # 100k rows at the end of a 100k-task run: no __dict__ each
class Row:
    values: TaskRow = field(default_factory=TaskRow)  # its cells by column (outputs/taskrow)
    last: AttemptRecord | None = None  # the attempt it is judged by (every field of it)
    metrics: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    busy: float = 0.0  # seconds of every attempt (retries and interrupted ones too)
    inputs: dict[str, str] = field(default_factory=dict)  # the matrix values it was made from
    seq: float = float("inf")  # its place in the config (a row of no descriptor: last)
    spend: TaskSpend | None = None  # issue 34: an agent task's tokens and cost (outputs/spend)
    repeat: RepeatOf | None = None  # issue 34: a repeat's task, which repeat, its fields


# the attempt cells of a task with no attempt yet: one dict shared by those rows (nothing
# writes into a row's ``last``), not 100k copies at the warm stop of a big run
NO_LAST = last_fields(None)


def unattempted_row(state: State, desc: Descriptor) -> Row:
    """:func:`row_for` of a descriptor with no attempt: the same row, without building the
    empty attempt's cells per task (100k at the warm stop of a big run)."""
    row = Row()
    row.values = TaskRow(
        task=desc.id if desc.has_id else "",
        name=desc.name,
        state=state.value,
        reason=desc.reason or "",
        last=NO_LAST,
    )
    row.busy = 0  # as the sum over no attempts
    row.inputs = desc.inputs or EMPTY
    row.seq = desc.seq
    row.metrics = EMPTY
    row.result = desc.result or EMPTY
    task = desc.task
    if task.get("usage") is not None:
        row.spend = task_spend(desc)
    if task.get("repeat_of") is not None:
        row.repeat = repeat_of(task)
    return row
