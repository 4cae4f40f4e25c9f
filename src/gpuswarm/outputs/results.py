"""Aggregation: one row per task (failed ones included) into results.tsv and summary.json.

Rates use honest denominators: a boolean result field is reported over the tasks that finished
(``of_done``) and over every task of the run (``of_total``), so a run where half the tasks crashed
cannot look perfect.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuswarm.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNFINISHED
from gpuswarm.core.fsutil import atomic_write_json, atomic_write_text
from gpuswarm.core.models import AttemptRecord, Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.records import why_unreadable
from gpuswarm.core.redact import Redactor, env_secret_values
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.outputs.energy import energy_of, energy_stats
from gpuswarm.outputs.gpumem import gpu_memory_stats
from gpuswarm.outputs.passk import RepeatOf, repeat_of, repeat_stats
from gpuswarm.outputs.spend import USAGE_COLUMNS, RunCost, RunSpend, TaskSpend, task_spend
from gpuswarm.outputs.summaryjson import FieldStats, SummaryJson
from gpuswarm.outputs.taskrow import FIXED_COLUMNS, TaskRow, last_fields
from gpuswarm.store.names import corrupt_reason, corrupt_task_id, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.spool import spooled_blobs

_EMPTY: dict[str, Any] = {}  # shared by rows without metrics or result; rows are read-only


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


def _exit_text(attempt: AttemptRecord | None) -> str:
    if attempt is None:
        return ""
    if attempt.signal:
        return attempt.signal
    return "" if attempt.returncode is None else str(attempt.returncode)


# the attempt cells of a task with no attempt yet: one dict shared by those rows (nothing
# writes into a row's ``last``), not 100k copies at the warm stop of a big run
_NO_LAST = last_fields(None)


def row_for(state: State, desc: Descriptor | dict[str, Any]) -> Row:
    """The row of one descriptor (a JSON dict from callers not yet typed)."""
    if not isinstance(desc, Descriptor):
        desc = Descriptor(desc)
    if desc.attempt_count == 0:  # most rows of a stopped big run: never attempted
        return _unattempted_row(state, desc)
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
    row.inputs = desc.inputs or _EMPTY
    row.seq = desc.seq
    row.metrics = (last.metrics if last else None) or _EMPTY  # the descriptor's dicts: no copies
    row.result = desc.result or _EMPTY
    if desc.task.get("usage") is not None:  # an agent's task: what its attempts spent
        row.spend = task_spend(desc)
    if desc.task.get("repeat_of") is not None:
        row.repeat = repeat_of(desc.task)
    return row


def _unattempted_row(state: State, desc: Descriptor) -> Row:
    """:func:`row_for` of a descriptor with no attempt: the same row, without building the
    empty attempt's cells per task (100k at the warm stop of a big run)."""
    row = Row()
    row.values = TaskRow(
        task=desc.id if desc.has_id else "",
        name=desc.name,
        state=state.value,
        reason=desc.reason or "",
        last=_NO_LAST,
    )
    row.busy = 0  # as the sum over no attempts
    row.inputs = desc.inputs or _EMPTY
    row.seq = desc.seq
    row.metrics = _EMPTY
    row.result = desc.result or _EMPTY
    task = desc.task
    if task.get("usage") is not None:
        row.spend = task_spend(desc)
    if task.get("repeat_of") is not None:
        row.repeat = repeat_of(task)
    return row


def collect(queue: DirQueue, redactor: Redactor | None = None) -> list[Row]:
    """Every task's row, redacted by ``redactor`` and every task's own env (one pattern for
    the run: the tasks' secret values are gathered first)."""
    rows: list[Row] = []
    secrets: set[str] = set()
    for state in State:
        for name in queue.names(state):
            desc = queue.read_desc(state, name)
            if desc is None:  # empty, garbage or mistyped: counted corrupt, never vanished
                rows += _unusable_row(queue, state, name)
                continue
            desc.default_id(task_id_of(name))
            rows.append(row_for(state, desc))
            if desc.env:
                secrets |= env_secret_values(desc.env)
    for _, blob in spooled_blobs(queue.paths):  # a streamed enqueue's, not yet in pending/
        spooled = Descriptor.parse(blob)
        rows.append(row_for(State.PENDING, spooled))
        if spooled.env:
            secrets |= env_secret_values(spooled.env)
    rows += _corrupt_rows(queue, {r.values.task for r in rows})
    sort_rows(rows)
    if redactor is not None:
        redact_rows(rows, redactor.including(values=secrets))
    return rows


_DIGITS = re.compile(r"(\d+)")


def natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that puts ``steps20`` before ``steps60`` before ``steps200``."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _DIGITS.split(text) if p)


def _value_order(text: str) -> tuple[int, float, tuple[tuple[int, int | str], ...]]:
    """Numbers by value (0.01 before 0.1), then other text in natural order."""
    try:
        return (0, float(text), ())
    except ValueError:
        return (1, 0.0, natural(text))


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
            spent = r.spend.cells() if r.spend is not None else _EMPTY
            cells += [spent.get(c) for c in usage_cols]
        cells += [r.metrics.get(c) for c in metric_cols]
        cells += [r.result.get(c) for c in result_cols]
        lines.append("\t".join(map(_cell, cells)))
    return "\n".join(lines) + "\n"


# a field named so says which end is best (loss: the lowest); any other: min and max only
_LOWER = re.compile(r"loss|err|time|second|latency|bpb|perplex|ppl|mse|mae|rmse|cost|regret")
_HIGHER = re.compile(r"acc|speedup|score|throughput|reward|f1|auc|precision|recall|bleu|gain")


def _numeric_stats(points: list[tuple[float, str]], key: str) -> FieldStats:
    """Stats of a numeric field over ``(value, task)`` points: the tasks at its ends (NaN
    never one), and the best point where the field's name says which end is best."""
    values = [v for v, _ in points]
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * (len(ordered) - 1) + 0.5))]
    finite = [p for p in points if not math.isnan(p[0])] or points
    low, high = min(finite, key=lambda p: p[0]), max(finite, key=lambda p: p[0])
    out: FieldStats = {
        "kind": "number",
        "n": len(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "p90": p90,
        "min": ordered[0],
        "max": ordered[-1],
        "min_task": low[1],
        "max_task": high[1],
    }
    name = key.rsplit(".", 1)[-1].lower()
    if _LOWER.search(name):
        out["best"] = {"task": low[1], "value": low[0], "by": "lowest"}
    elif _HIGHER.search(name):
        out["best"] = {"task": high[1], "value": high[0], "by": "highest"}
    return out


def _is_input(key: str, rows: list[Row]) -> bool:
    """Whether result field ``key`` repeats what each task was made from (``result.lr`` of a
    matrix over ``lr``): no measurement, so never averaged."""
    seen = False
    for r in rows:
        if key not in r.result:
            continue
        given = r.inputs.get(key)
        if given is None:
            return False
        value = r.result[key]
        try:
            same = float(value) == float(given)
        except (TypeError, ValueError):
            same = str(value) == given
        if not same:
            return False
        seen = True
    return seen


def field_stats(rows: list[Row]) -> dict[str, FieldStats]:
    """Per result/metric field: pass rates for booleans, mean/median/p90 for numbers with the
    tasks at their ends (and the best one, by the field's name), the values of a field that
    only repeats the task's inputs (``kind: input``: never averaged)."""
    total = sum(1 for r in rows if r.values.state not in APART)  # skipped, cancelled: apart
    done = sum(1 for r in rows if r.values.state == State.DONE.value)
    columns: dict[str, list[Any]] = {}
    tasks: dict[str, list[str]] = {}
    for r in rows:
        who = r.values.name or r.values.task
        for k, v in r.metrics.items():
            columns.setdefault(k, []).append(v)
            tasks.setdefault(k, []).append(who)
        for k, v in r.result.items():
            columns.setdefault(f"result.{k}", []).append(v)
            tasks.setdefault(f"result.{k}", []).append(who)
    inputs = {k for r in rows for k in r.inputs}
    out: dict[str, FieldStats] = {}
    for key, values in sorted(columns.items()):
        short = key.removeprefix("result.")
        if key.startswith("result.") and short in inputs and _is_input(short, rows):
            distinct = sorted({str(v) for v in values}, key=_value_order)
            out[key] = {"kind": "input", "n": len(values), "values": distinct[:50]}
        elif all(isinstance(v, bool) for v in values):
            true = sum(1 for v in values if v)
            out[key] = {
                "kind": "bool",
                "true": true,
                "of_done": done,
                "of_total": total,
                "rate_done": true / done if done else None,
                "rate_total": true / total if total else None,
            }
        else:
            nums = [
                (float(v), who)
                for v, who in zip(values, tasks[key], strict=True)
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            ]
            if nums:
                out[key] = _numeric_stats(nums, key)
    return out


def summarize(
    rows: list[Row], run_info: dict[str, Any], events_window: tuple[float, float] | None
) -> SummaryJson:
    counts = {s.value: 0 for s in State}
    for r in rows:
        counts[r.values.state] = counts.get(r.values.state, 0) + 1
    failures = [
        r.values.failure_json() for r in rows if r.values.state not in (State.DONE.value, *APART)
    ]
    skipped = [r.values.apart_json() for r in rows if r.values.state == State.SKIPPED.value]
    cancelled = [r.values.apart_json() for r in rows if r.values.state == State.CANCELLED.value]
    busy = sum(r.busy for r in rows)
    reasons: dict[str, int] = {}
    for f in failures:
        if f["state"] == State.FAILED.value:
            reasons[f["reason"]] = reasons.get(f["reason"], 0) + 1
    out: SummaryJson = {
        "run": run_info.get("run_dir", ""),
        "name": run_info.get("name", ""),
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "total": len(rows),
        # complete: every task ended done, skipped or cancelled (a person's choice; --strict
        # makes cancelled ones an exit code 1)
        "complete": counts[State.DONE.value] + sum(counts[k] for k in APART) == len(rows),
        "counts": shown_counts(counts),
        "busy_seconds": round(busy, 3),  # every attempt of every task, retries included
        "not_done": len(failures),  # the true count ("failures" lists the first 200)
        "failure_reasons": sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:20],
        "wall_seconds": round(events_window[1] - events_window[0], 3) if events_window else None,
        "failures": failures[:200],
        "skipped": skipped[:200],  # not failed, out of the pass rates (counts.skipped: all)
        "cancelled": cancelled[:200],  # by a person: not failed, out of the pass rates
        "fields": field_stats(rows),
        "gpu_memory": gpu_memory_stats(rows),
        "energy": energy_stats(rows),
    }
    if (cost := spend_stats(rows)) is not None:
        out["cost"] = cost
    if (reps := repeat_stats(rows)) is not None:
        out["repeats"] = reps
    return out


def spend_stats(rows: list[Row]) -> RunCost | None:
    """summary.json's ``cost`` (issue 34): tokens and USD in total, per slot and model, and
    per task done; None when no task reported usage."""
    spend = RunSpend()
    for r in rows:
        spend.add(r.spend, done=r.values.state == State.DONE.value)
    return spend.as_json()


def shown_counts(counts: dict[str, int]) -> dict[str, int]:
    """Counts per state as outputs show them: ``skipped`` and ``cancelled`` only when some task
    is (runs without them read as they always did); ``blocked`` too (issue 35)."""
    return {k: n for k, n in counts.items() if n or k not in (*APART, State.BLOCKED.value)}


#: States that ended a task without a failure and stay out of the pass-rate denominators.
APART = (State.SKIPPED.value, State.CANCELLED.value, State.DEPENDENCY_FAILED.value)  # + issue 35


#: How a run ended (summary.json ``state``); ``status``/``ls``/report add "live" and "crashed".
COMPLETE, WITH_FAILURES, STOPPED, UNFINISHED = (
    "complete",
    "finished with failures",
    "stopped",
    "unfinished",
)


def end_state(counts: dict[str, int], stopped: bool) -> str:
    """complete (every task done, skipped or cancelled), finished with failures (every task
    ran, some failed), stopped (Ctrl-C / SIGTERM; resume finishes it) or unfinished (tasks
    left)."""
    if counts.get(State.PENDING.value, 0) + counts.get(State.RUNNING.value, 0) == 0:
        bad = sum(n for k, n in counts.items() if k not in (State.DONE.value, *APART))
        return COMPLETE if bad == 0 else WITH_FAILURES
    return STOPPED if stopped else UNFINISHED


def write_outputs(
    paths: RunPaths,
    queue: DirQueue,
    run_info: dict[str, Any],
    window: tuple[float, float] | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write results.tsv and summary.json atomically (redacted by the run's redactor); return
    the summary."""
    redactor = run_redactor(run_info)
    rows = collect(queue, redactor)
    atomic_write_text(paths.results_tsv, to_tsv(rows))
    summary: dict[str, Any] = {**summarize(rows, run_info, window), **redactor.tree(extra or {})}
    summary["state"] = end_state(summary["counts"], bool(summary.get("stopped")))
    atomic_write_json(paths.summary_json, summary)
    return summary


@dataclass
class RunReport:
    """What a supervised run ended as: its folder, summary.json, and the exit code it means."""

    paths: RunPaths
    summary: dict[str, Any]
    interrupted: bool
    recovered: dict[str, int] | None = None
    strict: bool = False  # --strict: a cancelled task makes the exit code 1
    stopped_by: str | None = None  # the backend stopped it (its cluster's head is gone)
    halted: str | None = None  # the halt rule stopped it (issue 28): its reason
    budget: str | None = None  # the budget was spent (issue 34): its reason, how to raise it

    @property
    def exit_code(self) -> int:
        if self.halted:  # tasks are left: 1 when one failed (a fail= halt), 0 when the
            failed = (self.summary.get("counts") or {}).get(State.FAILED.value, 0)
            return EXIT_UNFINISHED if failed else EXIT_OK  # halt found what it waited for
        if self.stopped_by:
            return EXIT_UNFINISHED  # no one interrupted it: unfinished, `resume` goes on
        if self.budget and not self.summary.get("complete"):
            return EXIT_UNFINISHED  # issue 34: tasks left pending (reason budget)
        if self.interrupted:
            return EXIT_INTERRUPTED
        after = self.summary.get("after_all")
        if isinstance(after, dict) and not after.get("ok"):
            return EXIT_UNFINISHED  # the post-processing step failed
        if not self.summary.get("complete"):
            return EXIT_UNFINISHED
        cancelled = (self.summary.get("counts") or {}).get(State.CANCELLED.value, 0)
        return EXIT_UNFINISHED if self.strict and cancelled else EXIT_OK
