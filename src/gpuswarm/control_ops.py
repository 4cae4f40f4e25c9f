"""A person's changes to a run, live or stopped: add, cancel, retry, pause, priority (issue 17).

The CLI (``cli_control.py``) parses and prints; this module does the work through the store
(``store/queue.py`` for every transition, ``store/control.py`` for requests and pause flags) and
journals what it did (``Ev.CONTROL``, ``Ev.ADDED``, ``Ev.REQUEUED``). Each command first holds the
run's control lock and finishes what a killed earlier command left (``finish_holds``).

What each does on a live and on a stopped run:

- add: writes the new descriptors under hidden names (no fsync each), syncs once, journals
  ``added`` (naming the batch), renames them into pending/ and touches the ``added`` marker:
  live supervisors rescan pending/ at their next claim, so priorities hold against the tasks
  they had loaded. A crash in between is finished by the next control command or resume
  (:func:`finish_adds`): a batch the journal names is added, one it does not is removed; ids
  never collide (``<id>-2``, ``-3``...), seqs continue after the run's highest.
- cancel: a pending task ends cancelled at once (this command applies it); a running one gets a
  durable request the supervisor holding it applies on its next tick (``--wait`` blocks until it
  left running/). On a stopped run the request waits for the resume (recovery applies it). A task
  that has ended already is left as it is (a note, exit 0: nothing to do). The request is for
  the attempt under way (``store.control.too_late``): it never cancels a later retry.
- retry: failed / cancelled tasks back to pending with a fresh attempt budget (history kept),
  their cancel requests dropped. Nothing is started: a run without a live supervisor is
  finished with ``gpuswarm resume``.
- pause / unpause: the run's (or one slot's) pause flag; running tasks go on.
- priority: a pending task's new priority (its claim order). A running task's priority cannot
  change (it applies to pending tasks only): exit 2 saying so.

add, retry, unpause and priority touch the run's ``added`` marker: the keeper of every live
supervisor, on any host, stats it four times a second and wakes its loop to claim.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuswarm.config.commands import task_dumps
from gpuswarm.config.load import LoadedConfig, load_command_list, load_config, read_stdin
from gpuswarm.config.models import TaskOptions
from gpuswarm.control_deps import (
    AddedDeps,
    added_folder,
    cancel_blocked,
    fresh_ids,
    moved_blocked,
    retried,
)
from gpuswarm.core.errors import BadInputError, ConfigError, QueueError
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import dumps_compact, fsync_dir, pid_alive, sync_tree
from gpuswarm.core.models import Descriptor, State, base_name
from gpuswarm.core.paths import RunPaths, check_task_id
from gpuswarm.store import control
from gpuswarm.store.leases import is_live, registered_slot_ids
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.lookup import resolve_tasks, task_index
from gpuswarm.store.names import PRIORITY_LIMIT, corrupt_task_id, descriptor_name, task_id_of
from gpuswarm.store.queue import DirQueue, note_added
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import open_run

YAML_SUFFIXES = (".yaml", ".yml")
SHOWN_IDS = 100  # ids an ``added`` event (and add's output) lists at most
ENDED = (State.DONE, State.FAILED, State.SKIPPED, State.CANCELLED)


class NotApplicableError(BadInputError):
    """A control request that does not apply to the task's state (exit 2)."""


def resume_hint(paths: RunPaths) -> str:
    return f"no supervisor is live: resume it: gpuswarm resume {paths.root}"


# -- task arguments --------------------------------------------------------------------------
def _index(queue: DirQueue) -> dict[str, tuple[State, str]]:
    """Task id -> (state, file name) from the folders' names (no descriptor read)."""
    return {tid: (hit.state, hit.file) for tid, hit in task_index(RunReader(queue.paths)).items()}


INDEX_TRIES = 20  # scans of the state folders before a task in mid-move is given up on


def _resolve(s: _Session, args: Sequence[str]) -> tuple[dict[str, tuple[State, str]], list[str]]:
    """The ids ``args`` mean (ids, unambiguous id or name prefixes; exit 2 naming an unknown
    or ambiguous one) and where every task of the run is. A task moves between state folders
    by a rename while the folders are listed one after the other, so one scan can miss it:
    the scan is taken again until every id is in it (under the control lock nothing but a
    supervisor's own moves go on)."""
    ids = resolve_tasks(s.paths, args) if args else []
    for _ in range(INDEX_TRIES):
        known = _index(s.queue)
        if all(tid in known for tid in ids):
            return known, ids
        time.sleep(0.005)
    missing = [tid for tid in ids if tid not in known]
    raise QueueError(
        f"task {missing[0]} kept moving between states while it was looked up: try again"
    )


# -- the shared frame ------------------------------------------------------------------------
@dataclass
class _Session:
    paths: RunPaths
    info: dict[str, Any]
    queue: DirQueue
    ledger: Ledger
    me: str

    def announce_cancel(self, desc: Descriptor) -> None:
        self.ledger.emit(
            Ev.CONTROL,
            request="cancel",
            task=desc.id,
            by=self.me,
            applied_by=self.me,
            state=State.CANCELLED.value,
            frm=State.PENDING.value,
            reason=desc.reason,
        )


def _session(run_dir: Path, body: Callable[[_Session], Any]) -> Any:
    """Open the run, hold the control lock, finish cut-short holds, run ``body``."""
    paths, info = open_run(run_dir)
    queue = DirQueue(paths)
    ledger = Ledger(paths.events)
    try:
        s = _Session(paths, info, queue, ledger, control.asker())
        with queue.control_lock():
            queue.finish_holds(s.announce_cancel)
            finish_adds(paths)
            return body(s)
    finally:
        ledger.close()


# -- add -------------------------------------------------------------------------------------
def load_source(
    source: str, *, shell: bool, defaults: TaskOptions, known: Collection[str] = frozenset()
) -> LoadedConfig:
    """A YAML config (its ``tasks:``), a command list, or ``-`` (a command list on stdin).
    ``known``: the run's task ids, which the config's ``after:`` may name (issue 35)."""
    if source != "-" and Path(source).suffix in YAML_SUFFIXES:
        return load_config(Path(source), known=known)
    if source == "-":
        return load_command_list(
            None, read_stdin(), shell=shell, base_dir=Path.cwd(), defaults=defaults
        )
    return load_command_list(Path(source), shell=shell, base_dir=Path.cwd(), defaults=defaults)


def _fresh_id(task_id: str, taken: set[str]) -> str:
    if task_id not in taken:
        return task_id
    n = 2
    while True:
        tail = f"-{n}"
        candidate = task_id[: 128 - len(tail)] + tail
        if candidate not in taken:
            return check_task_id(candidate)
        n += 1


def _check_fits(dumps: Iterable[dict[str, Any]], info: dict[str, Any], source: str) -> None:
    per_task = int(info.get("gpus_per_task", 1))
    for dump in dumps:
        gpus = dump.get("gpus")
        if isinstance(gpus, int) and gpus > per_task:
            raise ConfigError(
                f"{source}: task {dump.get('id')!r}: gpus {gpus} is more than this run's "
                f"gpus_per_task ({per_task}); its slots hold {per_task} GPU(s) each: lower gpus"
            )


def add_tasks(run_dir: Path, loaded: LoadedConfig, deps: AddedDeps | None = None) -> dict[str, Any]:
    """Append ``loaded``'s tasks to a run (live or not); see the module's doc. ``deps``: the
    prerequisites ``--after`` & co. give them (issue 35; those with any wait in blocked/)."""
    dumps = list(task_dumps(loaded.tasks))
    deps = deps or AddedDeps()
    source = str(loaded.path) if loaded.path else "<stdin>"

    def body(s: _Session) -> dict[str, Any]:
        _check_fits(dumps, s.info, source)
        taken: set[str] = set()
        max_seq = -1
        for state in State:
            for name in s.queue.names(state):
                taken.add(task_id_of(name))
                max_seq = max(max_seq, _seq_of(name))
        for name in os.listdir(s.paths.corrupt) if s.paths.corrupt.is_dir() else []:
            found = corrupt_task_id(name)  # a task set aside keeps its id
            if found is not None:
                taken.add(found)
        renamed: dict[str, str] = {}
        deps.prepare(s.paths, dumps, fresh_ids(dumps, taken, _fresh_id))
        into_blocked: set[str] = set()  # final names renamed into blocked/ (issue 35)
        staged: list[tuple[str, str]] = []  # (temp name, final name)
        batch = f"{os.getpid()}.{time.time_ns()}"  # the added event names it: see finish_adds
        pending = s.paths.state_dir(State.PENDING.value)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        folder = os.open(pending, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for dump in dumps:
                original = str(dump["id"])
                tid = _fresh_id(original, taken)
                taken.add(tid)
                if tid != original:
                    renamed[original] = tid
                    dump["id"] = tid
                max_seq += 1
                desc = Descriptor.new(dump, max_seq)
                final = descriptor_name(desc.priority, max_seq, tid)
                if deps.place(desc, final):
                    into_blocked.add(final)
                temp = f"{ADDING}{batch}-{final}"  # invisible until renamed
                fd = os.open(temp, flags, 0o644, dir_fd=folder)
                try:
                    os.write(fd, dumps_compact(desc.raw))
                finally:
                    os.close(fd)
                staged.append((temp, final))
            sync_tree(pending)  # every descriptor's data on disk: one sync, not one per file
            deps.publish(s.paths)  # issue 35: edges known before the tasks are said or seen
            ids = [task_id_of(final) for _, final in staged]
            s.ledger.emit(
                Ev.ADDED,
                count=len(ids),
                blocked=len(into_blocked),  # issue 35: of them, waiting for prerequisites
                ids=ids[:SHOWN_IDS],
                by=s.me,
                source=source,
                batch=batch,
            )
            s.ledger.sync()  # the journal says it before the names become visible
            blocked = _open_blocked(s.paths) if into_blocked else None
            for temp, final in staged:
                moved_blocked(folder, temp, final, blocked if final in into_blocked else None)
            if blocked is not None:
                os.fsync(blocked)
                os.close(blocked)
        finally:
            os.close(folder)
        fsync_dir(pending)
        deps.settle(s.queue, s.ledger)  # issue 35: after prerequisites that ended already
        note_added(s.paths)
        live = is_live(s.paths)
        return {
            "run": str(s.paths.root),
            "added": len(ids),
            "ids": ids[:SHOWN_IDS],
            "renamed": dict(list(renamed.items())[:SHOWN_IDS]),
            "renamed_count": len(renamed),
            "live": live,
            "hint": "" if live else resume_hint(s.paths),
        }

    result: dict[str, Any] = _session(run_dir, body)
    return result


ADDING = ".adding-"  # pending/.adding-<pid>.<ns>-<name>: a task an add has written, not shown


def _open_blocked(paths: RunPaths) -> int:
    folder = paths.state_dir(State.BLOCKED.value)
    folder.mkdir(exist_ok=True)  # a run made before blocked/ existed
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)


def finish_adds(paths: RunPaths) -> int:
    """Adds a crash cut short (their writer is dead): a batch the journal's ``added`` event
    names is finished (its tasks renamed into pending/: the journal said they were added), one
    it does not name is removed (the add never said so). Returns how many tasks were added."""
    pending = paths.state_dir(State.PENDING.value)
    batches: dict[str, list[str]] = {}
    for name in os.listdir(pending):
        if name.startswith(ADDING):
            batch = name[len(ADDING) :].split("-", 1)[0]
            pid = batch.split(".", 1)[0]
            if pid.isdigit() and (int(pid) == os.getpid() or not pid_alive(int(pid))):
                batches.setdefault(batch, []).append(name)
    if not batches:
        return 0
    said = {str(e.get("batch")) for e in read_events(paths.events) if e.get("ev") == Ev.ADDED.value}
    added = 0
    for batch, names in batches.items():
        for name in names:
            final = name[len(ADDING) + len(batch) + 1 :]
            into = added_folder(paths, pending / name)  # pending/, or blocked/ (issue 35)
            if batch in said and not (into / final).exists():
                os.rename(pending / name, into / final)
                added += 1
            else:
                (pending / name).unlink(missing_ok=True)
    fsync_dir(pending)
    if added:
        note_added(paths)
    return added


def _seq_of(name: str) -> int:
    digits = base_name(name)[4:13]
    return int(digits) if digits.isdigit() else -1


# -- cancel ----------------------------------------------------------------------------------
def cancel_tasks(
    run_dir: Path, args: Sequence[str], *, reason: str, wait: float | None
) -> dict[str, Any]:
    """Cancel tasks: pending ones now, running ones by a request (``wait`` seconds: block
    until they left running/). Each row: task, was, now, note."""

    def body(s: _Session) -> tuple[RunPaths, list[dict[str, Any]], bool]:
        known, ids = _resolve(s, args)
        live = is_live(s.paths)
        rows: list[dict[str, Any]] = []
        for tid in ids:
            state, name = known[tid]
            row: dict[str, Any] = {"task": tid, "was": state.value, "now": state.value, "note": ""}
            if state is State.BLOCKED and cancel_blocked(s.queue, s.ledger, name, reason, s.me):
                row["now"] = State.CANCELLED.value  # issue 35: its dependents follow
                rows.append(row)
                continue
            state, attempt = control.request_cancel(
                s.queue, tid, state, name, reason, s.announce_cancel
            )
            row["was"] = State.PENDING.value if state is State.CANCELLED else state.value
            if state is State.CANCELLED:
                row["now"] = State.CANCELLED.value
            elif state is State.RUNNING:
                row["now"] = "cancel requested"
                row["attempt"] = attempt
                which = f"attempt {attempt}" if attempt is not None else "it"
                row["note"] = (
                    f"its supervisor stops {which} within about a second"
                    if live
                    else f"no supervisor is live: {which} ends cancelled when the run is resumed"
                )
            else:
                row["note"] = f"already {state.value}: nothing to do"
            rows.append(row)
        return s.paths, rows, live

    paths, rows, live = _session(run_dir, body)
    timed_out = False
    asked = [r for r in rows if r["now"] == "cancel requested"]
    if wait is not None and asked and live:
        timed_out = not _wait_left_running(paths, asked, wait)
    return {"run": str(paths.root), "tasks": rows, "live": live, "timed_out": timed_out}


def _wait_left_running(paths: RunPaths, rows: list[dict[str, Any]], timeout: float) -> bool:
    """Poll until every row's task has left running/ (its row's ``now`` updated)."""
    queue = DirQueue(paths)
    deadline = time.monotonic() + timeout
    left = {r["task"]: r for r in rows}
    while True:
        where = {task_id_of(n): st for st in State for n in queue.names(st)}
        for tid in list(left):
            state = where.get(tid)
            if state is not State.RUNNING:
                left.pop(tid)["now"] = state.value if state else "gone"
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


# -- retry -----------------------------------------------------------------------------------
def retry_tasks(
    run_dir: Path, args: Sequence[str], *, failed: bool, cancelled: bool
) -> dict[str, Any]:
    """Failed / cancelled tasks (named, or every one with ``failed`` / ``cancelled``) back to
    pending with a fresh attempt budget."""

    def body(s: _Session) -> dict[str, Any]:
        known, ids = _resolve(s, args)
        for tid in ids:
            state = known[tid][0]
            if state in (State.DONE, State.SKIPPED):
                raise NotApplicableError(
                    f"task {tid!r} is {state.value}: retry applies to failed or cancelled tasks"
                )
            if state is State.DEPENDENCY_FAILED:  # issue 35
                raise NotApplicableError(
                    f"task {tid!r} is dependency_failed: retry the prerequisite that failed "
                    "(its dependents come back with it)"
                )
        wanted = set(ids)
        wanted |= {t for t, (st, _) in known.items() if failed and st is State.FAILED}
        wanted |= {t for t, (st, _) in known.items() if cancelled and st is State.CANCELLED}
        rows: list[dict[str, Any]] = []
        _drop_requests(s, {t for t in wanted if known[t][0] in (State.FAILED, State.CANCELLED)})
        for tid in sorted(wanted):
            state, name = known[tid]
            row = {"task": tid, "was": state.value, "now": state.value, "note": ""}
            if state in (State.FAILED, State.CANCELLED):
                announce = _retry_announce(s, state)
                if s.queue.retry(state, name, announce) is not None:
                    row["now"] = State.PENDING.value
                else:
                    row["note"] = "gone meanwhile (another retry took it)"
            else:
                row["note"] = f"{state.value}: not ended, nothing to do"
            rows.append(row)
        retried(s.queue, s.ledger, rows)  # issue 35: dependency_failed dependents come back
        if any(r["now"] == State.PENDING.value for r in rows):
            note_added(s.paths)
        live = is_live(s.paths)
        return {
            "run": str(s.paths.root),
            "tasks": rows,
            "retried": sum(1 for r in rows if r["now"] == State.PENDING.value),
            "live": live,
            "hint": "" if live or not rows else resume_hint(s.paths),
        }

    result: dict[str, Any] = _session(run_dir, body)
    return result


def _drop_requests(s: _Session, tasks: set[str]) -> None:
    """The requests of the tasks a retry requeues (made for an attempt that ended), dropped
    before the tasks are pending again; journaled as such."""
    for req in control.drop_requests(s.paths, tasks):
        more = {"attempt": req.attempt} if req.attempt is not None else {}
        s.ledger.emit(
            Ev.CONTROL,
            request=req.kind,
            task=req.task,
            by=req.by,
            applied_by=s.me,
            **more,
            dropped="too late: the task ended before it was applied; retried since",
        )


def _retry_announce(s: _Session, frm: State) -> Callable[[Descriptor], object]:
    def announce(desc: Descriptor) -> None:
        s.ledger.emit(
            Ev.CONTROL,
            request="retry",
            task=desc.id,
            by=s.me,
            applied_by=s.me,
            state=State.PENDING.value,
            frm=frm.value,
        )
        s.ledger.emit(Ev.REQUEUED, task=desc.id, frm=frm.value, reason="retry")

    return announce


# -- pause -----------------------------------------------------------------------------------
def set_paused(run_dir: Path, slot: str | None, *, paused: bool) -> dict[str, Any]:
    """Pause (or unpause) the run, or one slot (an id as ``status`` shows it)."""

    def body(s: _Session) -> dict[str, Any]:
        if slot is not None:
            slots = registered_slot_ids(s.paths)
            if slots and slot not in slots and slot not in control.paused(s.paths).slots:
                raise BadInputError(
                    f"slot {slot!r}: this run has no such slot; its slots: {', '.join(slots)}"
                )
        try:
            changed = (control.pause if paused else control.unpause)(s.paths, slot)
        except ValueError as exc:
            raise BadInputError(f"--slot: {exc}") from None
        if changed and not paused:
            note_added(s.paths)  # live supervisors look again now, not at their next tick
        request = "pause" if paused else "unpause"
        if changed:  # a whole-run pause names no slot (a null slot is a line readers skip)
            where = {"slot": slot} if slot is not None else {}
            s.ledger.emit(Ev.CONTROL, request=request, **where, by=s.me, applied_by=s.me)
        now = control.paused(s.paths)
        return {
            "run": str(s.paths.root),
            "slot": slot,
            "changed": changed,
            "paused": now.run,
            "paused_slots": sorted(now.slots),
            "live": is_live(s.paths),
        }

    result: dict[str, Any] = _session(run_dir, body)
    return result


# -- priority --------------------------------------------------------------------------------
def set_priority(run_dir: Path, task: str, priority: int) -> dict[str, Any]:
    """A pending task's new priority (higher runs first)."""
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise BadInputError(
            f"priority {priority}: use -{PRIORITY_LIMIT}..{PRIORITY_LIMIT} (higher runs first)"
        )

    def body(s: _Session) -> dict[str, Any]:
        known, (tid,) = _resolve(s, [task])
        state, name = known[tid]
        desc = s.queue.read_desc(state, name)
        was = desc.priority if desc is not None else None

        def announce(d: Descriptor) -> None:
            s.ledger.emit(
                Ev.CONTROL,
                request="priority",
                task=tid,
                priority=priority,
                by=s.me,
                applied_by=s.me,
                state=State.PENDING.value,
            )

        if state is not State.PENDING or s.queue.reprioritize(tid, priority, announce) is None:
            now = State.RUNNING.value if state is State.PENDING else state.value
            raise NotApplicableError(
                f"task {tid!r} is {now}: a priority applies to pending tasks only (it decides "
                "which starts next); a running task keeps its place"
            )
        note_added(s.paths)
        return {"run": str(s.paths.root), "task": tid, "priority": priority, "was": was}

    result: dict[str, Any] = _session(run_dir, body)
    return result
