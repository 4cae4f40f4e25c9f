"""``gpuswarm check``: verify that a run is consistent, and repair what resume would repair.

Checks: every task in exactly one state folder; no unreadable descriptor; no stale temp file;
no lease held by a dead supervisor; events agree with folders (each task's last state-changing
event names its folder, and its ``started`` events match its recorded attempts); no task that the
journal knows of is missing; no task journaled ``finished ... done`` twice. ``--repair`` (only
on a run no supervisor holds) removes temp files, keeps the most advanced copy of a duplicated
task, moves unreadable descriptors aside and returns orphaned running tasks to pending/, as
``resume`` would; it never retries failures.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from gpuswarm.core.errors import RunLockedError
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.records import why_unreadable
from gpuswarm.core.runview import RunView, TaskView
from gpuswarm.core.words import counted
from gpuswarm.outputs.results import shown_counts
from gpuswarm.store.leases import attach, is_live, owner_alive
from gpuswarm.store.ledger import Ledger, bad_event_lines, read_events
from gpuswarm.store.names import corrupt_task_id, lease_of, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import open_run, set_aside, temp_files

# keep the latest
RANK = {
    State.DONE: 0,
    State.SKIPPED: 0,
    State.CANCELLED: 0,
    State.FAILED: 1,
    State.RUNNING: 2,
    State.PENDING: 3,
    State.DEPENDENCY_FAILED: 1,  # issue 35
    State.BLOCKED: 3,
}


@dataclass
class Finding:
    kind: str
    detail: str
    task: str | None = None
    repaired: bool = False

    def to_json(self) -> FindingJson:
        return {
            "kind": self.kind,
            "detail": self.detail,
            "task": self.task,
            "repaired": self.repaired,
        }


class FindingJson(TypedDict):
    kind: str
    detail: str
    task: str | None
    repaired: bool


class CheckReport(TypedDict):
    """``gpuswarm check --json``: the findings on a run."""

    run: str
    live: bool
    tasks: int
    counts: dict[str, int]  # skipped, cancelled: only when some are
    findings: list[FindingJson]
    consistent: bool


def _corrupt_task_ids(paths: RunPaths) -> set[str]:
    if not paths.corrupt.is_dir():
        return set()
    return {t for name in os.listdir(paths.corrupt) if (t := corrupt_task_id(name)) is not None}


def _places(reader: RunReader) -> dict[str, list[tuple[State, str]]]:
    where: dict[str, list[tuple[State, str]]] = {}
    for state in State:
        for name in reader.names(state):
            where.setdefault(task_id_of(name), []).append((state, name))
    return where


def _journal(paths: RunPaths) -> RunView:
    """What events.jsonl says, folded by the one reducer: per task its started events, the
    state its last state-changing event names, its completions; tasks added later."""
    return RunView.of_journal(read_events(paths.events))


def _tasks(journal: RunView) -> dict[str, TaskView]:
    return journal.tasks or {}


def _duplicate_completions(journal: RunView) -> list[Finding]:
    """A task journaled ``finished ... done`` more than once ran to completion twice (e.g. a
    stalled supervisor committed a task another one had reclaimed and re-run)."""
    return [
        Finding(
            "duplicate-completion",
            f"finished done {len(t.completions)} times in the journal "
            f"(attempts {', '.join(str(a) for a in t.completions)})",
            task,
        )
        for task, t in sorted(_tasks(journal).items())
        if len(t.completions) > 1
    ]


def attempt_bounds(desc: Descriptor, *, running: bool) -> tuple[int, int]:
    """How many ``started`` events a descriptor's attempts account for.

    Each recorded attempt had one, except that an attempt recorded as ``lost`` (its supervisor
    died) may have died between the claim and its ``started`` line; a claimed, running task has
    one more (unless it only waits out a retry backoff).
    """
    attempts = desc.attempts
    lost = sum(1 for a in attempts if a.kind == "lost")
    extra = 1 if running and not desc.retry_at else 0
    return len(attempts) - lost + extra, len(attempts) + extra


def _temp_files(paths: RunPaths) -> list[Finding]:
    return [Finding("temp-file", f"{p.parent.name}/{p.name}") for p in temp_files(paths)]


Where = dict[str, list[tuple[State, str]]]


def _duplicates(
    queue: DirQueue, where: dict[str, list[tuple[State, str]]], repair: bool
) -> list[Finding]:
    out = []
    for task, places in where.items():
        if len(places) < 2:
            continue
        keep = min(places, key=lambda p: RANK[p[0]])
        if repair:
            for state, name in places:
                if (state, name) != keep:
                    queue.quarantine(queue.paths.state_dir(state.value) / name, "duplicate")
            where[task] = [keep]
        shown = ", ".join(s.value for s, _ in places)
        out.append(Finding("duplicate", f"in {shown}; kept {keep[0].value}", task, repair))
    return out


def _task_findings(
    reader: RunReader, where: Where, journal: RunView, live: bool, ttl: float
) -> list[Finding]:
    tasks = _tasks(journal)
    out = []
    for task, places in sorted(where.items()):
        if len(places) > 1:
            continue  # reported as a duplicate
        state, name = places[0]
        data = reader.read(state, name)
        if data is None:
            why = why_unreadable(reader.paths.state_dir(state.value) / name) or "gone"
            out.append(Finding("unreadable", f"{state.value}/{name}: {why}", task))
            continue
        lease = lease_of(name)
        if state is State.RUNNING and lease and not owner_alive(reader.paths, lease[0], ttl):
            if not live:
                out.append(Finding("stale-lease", f"its supervisor {lease[0]} is gone", task))
            continue
        low, high = attempt_bounds(data, running=state is State.RUNNING)
        seen = tasks[task].started if task in tasks else 0
        if not low <= seen <= high:
            want = str(high) if low == high else f"{low}-{high}"
            out.append(Finding("attempts", f"{seen} started events, {want} expected", task))
        said = tasks[task].state if task in tasks else "pending"
        if task not in tasks and state is State.BLOCKED:  # created blocked (issue 35)
            said = State.BLOCKED.value
        begun_retry = state in (State.FAILED, State.CANCELLED) and data.state == State.PENDING.value
        if said != state.value and not (begun_retry and said == State.PENDING.value):
            # (a retry saved and journaled, not yet renamed: resume finishes it)
            out.append(Finding("events", f"journal says {said}, folder {state.value}", task))
    return out


def _lost(paths: RunPaths, task_count: int, where: Where, journal: RunView) -> list[Finding]:
    known = set(where) | _corrupt_task_ids(paths)
    missing = sorted(set(_tasks(journal)) - known)
    out = [Finding("lost", "in the journal, in no folder", t) for t in missing]
    expected = task_count + journal.added
    if len(known) < expected:
        out.append(Finding("lost", f"{counted(expected, 'task')} created, {len(known)} found"))
    return out


def _set_aside_unusable(queue: DirQueue, ledger: Ledger) -> list[Finding]:
    """``--repair``: a descriptor in done/, failed/ or pending/ that is empty, garbage or
    mistyped cannot be re-run (its task spec is what is lost); it goes to corrupt/ with the
    reason in its name and a ``corrupt`` event, so it is counted, and the run is not complete."""
    out = []
    for state in (State.DONE, State.FAILED, State.PENDING):
        for name in queue.names(state):
            path = queue.paths.state_dir(state.value) / name
            why = why_unreadable(path) if queue.read(state, name) is None else None
            if why is not None:
                set_aside(queue, ledger, path, f"unreadable {state.value}: {why}")
                detail = f"{state.value}/{name}: {why}; moved to corrupt/"
                out.append(Finding("unreadable", detail, task_id_of(name), repaired=True))
    return out


def _leftovers(found: list[int | str]) -> list[Finding]:
    if not found:
        return []
    shown = ", ".join(str(x) for x in found[:5]) + (" ..." if len(found) > 5 else "")
    return [
        Finding(
            "leftover",
            f"{len(found)} leftovers of its dead supervisors' attempts are still there ({shown}); "
            "gpuswarm check --repair (or resume) ends and removes them",
        )
    ]


def _bad_events(paths: RunPaths) -> list[Finding]:
    return [
        Finding("bad-event", f"events.jsonl line {n}: {why} (skipped by every reader)")
        for n, why in bad_event_lines(paths.events)[:50]
    ]


Recover = Callable[[DirQueue, Ledger], dict[str, int]]
"""What ``--repair`` runs under the run lock: recovery as resume does it (ending a dead owner's
leftovers through the run's backend), handed in by the caller: outputs know no backend."""


Leftovers = Callable[[], list[int | str]]
"""What of the run's attempts still runs or is still there (pids, containers), through the
run's backend; asked only when no supervisor holds the run."""


def check_run(
    run_dir: Path,
    *,
    repair: bool = False,
    recover: Recover | None = None,
    leftovers: Leftovers | None = None,
) -> CheckReport:
    """The findings on a run; with ``repair`` (and the caller's ``recover``) first repaired."""
    if repair and recover is None:
        raise ValueError("check_run(repair=True) needs the recover to run")
    paths, info = open_run(run_dir)
    ttl = float(info.get("settings", {}).get("lease_ttl", 30.0))
    live = is_live(paths)
    if repair and live:
        raise RunLockedError(f"{paths.root} is live; check it without --repair, or stop it first")
    queue = DirQueue(paths)  # --repair moves through the queue; everything else only reads
    reader = RunReader(paths, queue)
    findings: list[Finding] = []
    if repair:
        with attach(paths, exclusive_start=True):
            findings += _duplicates(queue, _places(reader), repair=True)
            ledger = Ledger(paths.events)
            assert recover is not None
            moved = recover(queue, ledger)
            findings += _set_aside_unusable(queue, ledger)
            ledger.close()
            for kind in ("temp_files", "interrupted", "recovered", "requeued", "corrupt"):
                if moved[kind]:
                    findings.append(Finding("recovered", f"{moved[kind]} {kind}", repaired=True))
    else:
        findings += _temp_files(paths)
        if not live and leftovers is not None:
            findings += _leftovers(leftovers())
    where = _places(reader)
    if not repair:
        findings += _duplicates(queue, where, repair=False)
    journal = _journal(paths)
    findings += _task_findings(reader, where, journal, live, ttl)
    findings += _duplicate_completions(journal)
    findings += _lost(paths, int(info.get("task_count", 0)), where, journal)
    findings += _bad_events(paths)
    open_problems = [
        f
        for f in findings
        if not f.repaired
        and not (live and f.kind == "temp-file")
        and f.kind != "bad-event"  # reported; every reader skips such a line
    ]
    return {
        "run": str(paths.root),
        "live": live,
        "tasks": len(where),
        "counts": shown_counts(reader.counts()),  # skipped, cancelled: only when some are
        "findings": [f.to_json() for f in findings],
        "consistent": not open_problems,
    }
