"""Read-only views of runs: ``gpuswarm status`` and ``gpuswarm ls``.

Status never scans more than it must: counts come from folder listings, the ETA from the tail
of events.jsonl, and only running and (the latest) failed descriptors are read.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from gpuswarm.core.events import Finished, SupervisorStarted
from gpuswarm.core.fsutil import read_json
from gpuswarm.core.logs import log_tail
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths, find_runs
from gpuswarm.core.redact import Redactor
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.outputs.aggregate import STOPPED, UNFINISHED, WITH_FAILURES, end_state
from gpuswarm.outputs.results import shown_counts
from gpuswarm.outputs.slurmview import slurm_view
from gpuswarm.outputs.statusjson import (
    Eta,
    FailureLine,
    LiftedQuarantine,
    QuarantineFile,
    RunLine,
    RunningLine,
    StatusJson,
    StatusShown,
)
from gpuswarm.store.control import paused
from gpuswarm.store.quarantines import Quarantined, lift_by_hand
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runindex import known_runs
from gpuswarm.store.runs import open_run
from gpuswarm.store.spent import journal_spend

MAX_FAILURES = 20


def _running(reader: RunReader, now: float) -> list[RunningLine]:
    return [
        {
            "task": r.task,
            "name": r.name,
            "owner": r.owner,
            "host": r.host,
            "slot": r.slot,  # unique in the run
            "attempt": r.attempt,
            "elapsed": round(now - r.since, 1),
            "timeout": r.timeout,
            "log": str(r.log) if r.log else None,  # None while a retry waits out its backoff
            "retry_at": r.retry_at,
        }
        for r in reader.running()
        if not r.ending  # ended, its outcome being committed: its slot runs the next one
    ]


def _failures(
    reader: RunReader, redactor: Redactor, limit: int = MAX_FAILURES
) -> list[FailureLine]:
    out: list[FailureLine] = []
    for name, found in reader.latest(State.FAILED, limit):
        desc = found if found is not None else Descriptor({"task": {}})
        task_id = reader.task_id(name, found)
        log = reader.last_log(task_id, desc)
        out.append(
            {
                "task": task_id,
                "name": desc.name,
                "attempts": desc.counted_count,  # as results.tsv counts them
                "interrupted": desc.attempt_count - desc.counted_count,  # not counted
                "reason": desc.reason or "",
                "log": str(log) if log else None,
                "log_tail": _redacted_tail(log, desc, redactor),
            }
        )
    return out


def _redacted_tail(log: Path | None, desc: Descriptor, redactor: Redactor) -> str:
    """A log tail redacted by the run's redactor and the task's own env."""
    if log is None or not log.exists():
        return ""
    return redactor.including(desc.env).text(log_tail(log, max_lines=8))


def _eta(reader: RunReader, pending: int, running: int, slots: int) -> Eta:
    durations = [
        float(e.seconds)
        for e in reader.tail()
        if isinstance(e, Finished) and e.state == "done" and e.seconds is not None
    ]
    if not durations or slots <= 0:
        return {"mean_seconds": None, "eta_seconds": None}
    mean = statistics.fmean(durations)
    remaining = pending + running / 2
    return {"mean_seconds": round(mean, 3), "eta_seconds": round(remaining * mean / slots, 1)}


def run_status(run_dir: Path) -> StatusJson:
    paths, info = open_run(run_dir)
    reader = RunReader(paths)
    redactor = run_redactor(info)
    now = time.time()
    counts = shown_counts(reader.counts())
    slots = int(info.get("slot_count") or 1)
    live = reader.live()
    shown: StatusShown = {
        "name": info.get("name", ""),
        "created": info.get("created"),
        "live": live,
        "state": (state := run_state(paths, counts, live)),
        "hint": _hint(paths, state),
        "gpus": info.get("gpus"),
        "counts": counts,
        "total": sum(counts.values()),
        "running": _running(reader, now),
        "failures": _failures(reader, redactor),
        "eta": _eta(reader, counts["pending"], counts["running"], slots) if live else None,
        "corrupt": reader.corrupt(),
        "quarantined": _quarantined(reader, live),
        "gpus_held": [{"gpu": g, "reason": why} for g, why in sorted(reader.held_gpus().items())],
        "waiting_for_gpu": (
            [{"task": t, "reason": why} for t, why in sorted(reader.waiting_for_gpu().items())]
            if live
            else []
        ),
        "paused": {"run": (p := paused(paths)).run, "slots": sorted(p.slots)},
        "slurm": slurm_view(paths.root),  # issue 36: worker jobs, the allocation
        "cost": journal_spend(paths.events, counts.get("done", 0)),  # issue 34; None: no agents
    }
    redacted: StatusShown = redactor.tree(shown)  # names, reasons: one redactor
    return {"run": str(paths.root), **redacted}


def _hint(paths: RunPaths, state: str) -> str:
    """What to do about a run in ``state`` (empty when nothing is needed)."""
    if state == CRASHED:
        return (
            "its supervisor is gone (killed or crashed): the running rows are stale leases; "
            f"finish it with: gpuswarm resume {paths.root}"
        )
    if state in (STOPPED, UNFINISHED, WITH_FAILURES):
        why = _stopped_by(paths) if state == STOPPED else None  # a halt, Ctrl-C, a lost head
        return f"{f'stopped by {why}; ' if why else ''}finish it with: gpuswarm resume {paths.root}"
    return ""


def _stopped_by(paths: RunPaths) -> str | None:
    try:
        summary = read_json(paths.summary_json)
    except (OSError, ValueError):
        return None
    why = summary.get("stopped_by") if isinstance(summary, dict) else None
    return why if isinstance(why, str) and why else None


def _quarantined(reader: RunReader, live: bool) -> list[QuarantineFile | Quarantined]:
    """Slots out of rotation: a live run's quarantine files, else what its summary recorded."""
    if live:
        return [_file_record(q) for q in reader.quarantines()]
    try:
        summary = read_json(reader.paths.summary_json)
    except (OSError, ValueError):
        return []
    found = summary.get("quarantined") if isinstance(summary, dict) else None
    held = [q for q in found or [] if isinstance(q, dict) and not q.get("lifted")]
    return cast(list[QuarantineFile | Quarantined], held)  # as its supervisor wrote them


def _file_record(found: Mapping[str, object]) -> QuarantineFile:
    """A quarantine file as read (``store.reader``), without the name it was read from."""
    return cast(QuarantineFile, {k: v for k, v in found.items() if k != "file"})


def lift_quarantine(run_dir: Path, slot: str | None) -> list[LiftedQuarantine]:
    """``gpuswarm unquarantine``: remove the quarantine files of a live run's slot(s)."""
    paths, _ = open_run(run_dir)
    return cast(list[LiftedQuarantine], lift_by_hand(paths, slot))


LIVE, CRASHED = "live", "crashed"


def run_state(paths: RunPaths, counts: dict[str, int], live: bool) -> str:
    """live, crashed (no supervisor, yet tasks in running/: its owner died), or how the last
    supervisor ended (summary.json: complete, finished with failures, stopped, unfinished)."""
    if live:
        return LIVE
    if counts.get("running", 0) > 0:
        return CRASHED
    try:
        summary = read_json(paths.summary_json)
    except (OSError, ValueError):
        summary = None
    stopped = isinstance(summary, dict) and bool(summary.get("stopped"))
    left = counts.get("pending", 0) + counts.get("blocked", 0) > 0  # blocked: issue 35
    if left and not isinstance(summary, dict):
        return CRASHED if _ever_started(paths) else UNFINISHED
    return end_state(counts, stopped and left)


def _ever_started(paths: RunPaths) -> bool:
    return any(isinstance(e, SupervisorStarted) for e in RunReader(paths).tail())


def list_runs(workspace: Path, *, indexed: bool = False) -> list[RunLine]:
    """A row per run under ``workspace`` (``indexed``: and per run in the index of the user's
    runs, by absolute path), oldest first."""
    runs = known_runs(workspace)[::-1] if indexed else find_runs(workspace)
    out: list[RunLine] = []
    for run in runs:
        reader = RunReader(RunPaths(run))
        try:
            counts = shown_counts(reader.counts())
            unusable = reader.empty_descriptors((State.DONE, State.FAILED))
        except OSError:
            continue
        for state, n in unusable.items():  # a descriptor truncated to 0 bytes is no task done
            counts[state] -= n
        counts["corrupt"] = sum(unusable.values()) + len(reader.corrupt(visible=True))
        out.append(
            {
                "run": str(run),
                "name": run.parent.name,
                "live": (live := reader.live()),
                "state": run_state(reader.paths, counts, live),
                "counts": counts,
                "total": sum(counts.values()),
            }
        )
    return out
