"""results.tsv's rows: one per task (failed ones included), read from the queue, sorted in the
config's order, redacted, written as TSV; the states apart from the pass rates and the counts
the outputs show. summary.json is :mod:`gpuswarm.outputs.aggregate`'s.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from contextlib import nullcontext
from typing import Any

from gpuswarm.core.models import AttemptRecord, Descriptor, State
from gpuswarm.core.records import why_unreadable
from gpuswarm.core.redact import Redactor, env_secret_values
from gpuswarm.outputs.createdrows import CreatedRows
from gpuswarm.outputs.energy import energy_of
from gpuswarm.outputs.passk import repeat_of
from gpuswarm.outputs.rowtypes import EMPTY, Row, unattempted_row
from gpuswarm.outputs.spend import USAGE_COLUMNS, task_spend
from gpuswarm.outputs.taskrow import FIXED_COLUMNS, TaskRow, last_fields
from gpuswarm.store.names import corrupt_reason, corrupt_task_id, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.spool import spooled_blobs


def _exit_text(attempt: AttemptRecord | None) -> str:
    if attempt is None:
        return ""
    if attempt.signal:
        return attempt.signal
    return "" if attempt.returncode is None else str(attempt.returncode)


def row_for(state: State, desc: Descriptor | dict[str, Any]) -> Row:
    """The row of one descriptor (a JSON dict from callers not yet typed)."""
    if not isinstance(desc, Descriptor):
        desc = Descriptor(desc)
    if desc.attempt_count == 0:  # most rows of a stopped big run: never attempted
        return unattempted_row(state, desc)
    last = desc.last_attempt
    row = Row()
    energy_j, energy_mode = energy_of(desc)
    row.values = TaskRow(
        task=desc.id if desc.has_id else "",
        name=desc.name,
        state=state.value,
        attempts=desc.counted_count,
        gpus=",".join(str(g) for g in last.gpus or ()) if last else "",
        seconds=round(float(last.duration), 3) if last and last.duration is not None else "",
        exit=_exit_text(last),
        reason=desc.reason or (last.reason if last else None) or "",
        last=last_fields(last),
        energy_j=energy_j,
        energy_mode=energy_mode,
    )
    row.last = last
    row.busy = desc.busy_seconds
    row.inputs = desc.inputs or EMPTY
    row.seq = desc.seq
    row.metrics = (last.metrics if last else None) or EMPTY  # the descriptor's dicts: no copies
    row.result = desc.result or EMPTY
    if desc.task.get("usage") is not None:  # an agent's task: what its attempts spent
        row.spend = task_spend(desc)
    if desc.task.get("repeat_of") is not None:
        row.repeat = repeat_of(desc.task)
    return row


def collect(queue: DirQueue, redactor: Redactor | None = None) -> list[Row]:
    """Every task's row, redacted by ``redactor`` and every task's own env (one pattern for
    the run: the tasks' secret values are gathered first). The tasks this process created and
    nobody changed since are not read (outputs/createdrows.py)."""
    rows: list[Row] = []
    secrets: set[str] = set()
    created = CreatedRows.of(queue)
    for state in State:
        with nullcontext(None) if created is None else created.in_folder(queue, state) as known:
            for name in queue.names(state):
                if known is not None and (row := known(name)) is not None:
                    rows.append(row)
                    continue
                desc = queue.read_desc(state, name)
                if desc is None:  # empty, garbage or mistyped: counted corrupt, never vanished
                    rows += _unusable_row(queue, state, name)
                    continue
                desc.default_id(task_id_of(name))
                rows.append(row_for(state, desc))
                if desc.env:
                    secrets |= env_secret_values(desc.env)
    if created is not None and (spooled_rows := created.spooled(queue.paths)) is not None:
        rows += spooled_rows
    else:
        rows += _spooled_rows(queue, secrets)
    if created is not None:
        secrets |= created.secrets()
    rows += _corrupt_rows(queue, {r.values.task for r in rows})
    sort_rows(rows)
    if redactor is not None:
        redact_rows(rows, redactor.including(values=secrets))
    return rows


def _spooled_rows(queue: DirQueue, secrets: set[str]) -> list[Row]:
    """The rows of a streamed enqueue's tasks not yet in pending/ (the spool read); their
    secret values join ``secrets``."""
    rows: list[Row] = []
    for _, blob in spooled_blobs(queue.paths):
        spooled = Descriptor.parse(blob)
        rows.append(row_for(State.PENDING, spooled))
        if spooled.env:
            secrets |= env_secret_values(spooled.env)
    return rows


_DIGITS = re.compile(r"(\d+)")


def natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts ``steps20`` before ``steps60`` before ``steps200``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(text) if p)


def _order(row: Row) -> tuple[float, tuple[tuple[int, int | str], ...]]:
    """The config's order (submission), then natural order of the ids (rows of no
    descriptor, tasks of equal place)."""
    return row.seq, natural(row.values.task)


def sort_rows(rows: list[Row]) -> None:
    """``rows.sort(key=_order)``, with the natural order of the ids built only for rows that
    share their place (corrupt ones, rows of no descriptor): the same order, without a regex
    split of 100k ids."""
    shared = Counter(r.seq for r in rows)
    rows.sort(key=lambda r: _order(r) if shared[r.seq] > 1 else (r.seq, ()))


def _has_text(d: dict[str, Any]) -> bool:
    return any(isinstance(v, str | dict | list) for v in d.values()) or any(
        not k.isidentifier() or len(k) > 16 for k in d
    )


def redact_rows(rows: list[Row], redactor: Redactor) -> None:
    """Names, reasons and the string fields (and keys) of metrics and results, in place: a
    task writes its result file, and a name or a reason may quote a secret."""
    for r in rows:
        cells = r.values
        if cells.name:
            cells.name = redactor.text(cells.name)
        if cells.reason:
            cells.reason = redactor.text(cells.reason)
        if r.metrics and _has_text(r.metrics):
            r.metrics = redactor.tree(r.metrics)
        if r.result and _has_text(r.result):
            r.result = redactor.tree(r.result)


def _unusable_row(queue: DirQueue, state: State, name: str) -> list[Row]:
    """A descriptor in a state folder that cannot be used: a ``corrupt`` row with the reason
    (none when it has just moved on: a live run)."""
    why = why_unreadable(queue.paths.state_dir(state.value) / name)
    if why is None:
        return []
    return [Row(values=TaskRow.corrupt(task_id_of(name), f"descriptor in {state.value}/: {why}"))]


def _corrupt_rows(queue: DirQueue, known: set[str]) -> list[Row]:
    """Tasks whose only descriptor was moved to corrupt/: counted, so nothing vanishes."""
    folder = queue.paths.corrupt
    rows: list[Row] = []
    for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
        task = corrupt_task_id(name)
        if task is None or task in known:
            continue  # e.g. a duplicate set aside by `check --repair`
        known.add(task)
        reason = corrupt_reason(name)
        rows.append(Row(values=TaskRow.corrupt(task, f"descriptor {reason}")))
    return rows


def _cell(value: Any) -> str:
    kind = type(value)
    if kind is str and "\t" not in value and "\n" not in value and "\r" not in value:
        return value  # type: ignore[no-any-return]  # most cells: a plain string, kept
    if kind is int:  # not a bool (its type is bool)
        return str(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def to_tsv(rows: list[Row]) -> str:
    metric_cols = sorted({k for r in rows for k in r.metrics})
    result_cols = sorted({k for r in rows for k in r.result})
    usage_cols = USAGE_COLUMNS if any(r.spend is not None for r in rows) else ()
    header = [*FIXED_COLUMNS, *usage_cols, *metric_cols, *(f"result.{k}" for k in result_cols)]
    lines = ["\t".join(header)]
    for r in rows:
        cells = r.values.cells()
        if usage_cols:
            spent = r.spend.cells() if r.spend is not None else EMPTY
            cells += [spent.get(c) for c in usage_cols]
        cells += [r.metrics.get(c) for c in metric_cols]
        cells += [r.result.get(c) for c in result_cols]
        lines.append(_tsv_line(cells))
    return "\n".join(lines) + "\n"


def _tsv_line(cells: list[object]) -> str:
    """``"\t".join(map(_cell, cells))``: the strings joined as they are, then checked in one
    pass for a tab or line break inside one of them (100k rows at a big run's end)."""
    parts = [c if type(c) is str else _cell(c) for c in cells]
    line = "\t".join(parts)
    if line.count("\t") == len(parts) - 1 and "\n" not in line and "\r" not in line:
        return line
    return "\t".join(map(_cell, cells))


def shown_counts(counts: dict[str, int]) -> dict[str, int]:
    """Counts per state as outputs show them: ``skipped`` and ``cancelled`` only when some task
    is (runs without them read as they always did); ``blocked`` too (issue 35)."""
    return {k: n for k, n in counts.items() if n or k not in (*APART, State.BLOCKED.value)}


#: States that ended a task without a failure and stay out of the pass-rate denominators.
APART = (State.SKIPPED.value, State.CANCELLED.value, State.DEPENDENCY_FAILED.value)  # + issue 35
