"""A run's outputs written: summary.json from its rows (counts, failures, field stats, GPU
memory, energy, cost, repeats), with results.tsv, and how the run ended (``end_state``)."""

from __future__ import annotations

import time

from gpuswarm.core.fsutil import atomic_write_json, atomic_write_text
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.outputs.energy import energy_stats
from gpuswarm.outputs.fieldstats import field_stats
from gpuswarm.outputs.gpumem import gpu_memory_stats
from gpuswarm.outputs.passk import repeat_stats
from gpuswarm.outputs.results import APART, collect, shown_counts, to_tsv
from gpuswarm.outputs.rowtypes import Row
from gpuswarm.outputs.spend import RunCost, RunSpend
from gpuswarm.outputs.summaryjson import RunSummary, SessionEnd, SummaryJson
from gpuswarm.outputs.taskrow import ApartJson
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord


def summarize(
    rows: list[Row], record: RunRecord, events_window: tuple[float, float] | None
) -> SummaryJson:
    counts = {s.value: 0 for s in State}
    for r in rows:
        counts[r.values.state] = counts.get(r.values.state, 0) + 1
    failing = [r for r in rows if r.values.state not in _NOT_FAILED]  # rows, not 100k dicts
    failures = [r.values.failure_json() for r in failing[:200]]
    skipped = _apart(rows, State.SKIPPED.value, counts)
    cancelled = _apart(rows, State.CANCELLED.value, counts)
    busy = sum(r.busy for r in rows)
    reasons: dict[str, int] = {}
    for r in failing:
        if r.values.state == State.FAILED.value:
            reasons[r.values.reason] = reasons.get(r.values.reason, 0) + 1
    out: SummaryJson = {
        "run": record.run_dir,
        "name": record.name,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "total": len(rows),
        # complete: every task ended done, skipped or cancelled (a person's choice; --strict
        # makes cancelled ones an exit code 1)
        "complete": counts[State.DONE.value] + sum(counts[k] for k in APART) == len(rows),
        "counts": shown_counts(counts),
        "busy_seconds": round(busy, 3),  # every attempt of every task, retries included
        "not_done": len(failing),  # the true count ("failures" lists the first 200)
        "failure_reasons": sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:20],
        "wall_seconds": round(events_window[1] - events_window[0], 3) if events_window else None,
        "failures": failures,  # the first 200
        "skipped": skipped,  # not failed, out of the pass rates (counts.skipped: all)
        "cancelled": cancelled,  # by a person: not failed, out of the pass rates
        "fields": field_stats(rows),
        "gpu_memory": gpu_memory_stats(rows),
        "energy": energy_stats(rows),
    }
    if (cost := spend_stats(rows)) is not None:
        out["cost"] = cost
    if (reps := repeat_stats(rows)) is not None:
        out["repeats"] = reps
    return out


_NOT_FAILED = frozenset((State.DONE.value, *APART))


def _apart(rows: list[Row], state: str, counts: dict[str, int]) -> list[ApartJson]:
    """summary.json's entries of the first 200 rows in ``state`` (none looked for when none is)."""
    if not counts.get(state):
        return []
    return [r.values.apart_json() for r in rows if r.values.state == state][:200]


def spend_stats(rows: list[Row]) -> RunCost | None:
    """summary.json's ``cost`` (issue 34): tokens and USD in total, per slot and model, and
    per task done; None when no task reported usage."""
    spend = RunSpend()
    for r in rows:
        spend.add(r.spend, done=r.values.state == State.DONE.value)
    return spend.as_json()


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
    record: RunRecord,
    window: tuple[float, float] | None,
    extra: SessionEnd | None = None,
) -> RunSummary:
    """Write results.tsv and summary.json atomically (redacted by the run's redactor); return
    the summary."""
    redactor = run_redactor(record.to_json())
    rows = collect(queue, redactor)
    atomic_write_text(paths.results_tsv, to_tsv(rows))
    ended: SessionEnd = redactor.tree(extra or {})
    summary: RunSummary = {**summarize(rows, record, window), **ended}
    summary["state"] = end_state(summary["counts"], bool(summary.get("stopped")))
    atomic_write_json(paths.summary_json, summary)
    return summary
