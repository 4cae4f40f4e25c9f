"""A person's changes to a run, live or stopped: add, cancel, retry, requeue, pause, priority.

Each verb is a typed request (:mod:`gpuswarm.core.verbs`, one ``Kind`` each) with one
handler here (:data:`HANDLERS`); :func:`execute` runs it under the run's control lock. The CLI
(``cli/control.py``) and the dashboard build requests and print; this module does the work
through the store (``store/queue.py`` for every transition, ``store/control.py`` for requests
and pause flags) and journals what it did (``Ev.CONTROL``, ``Ev.ADDED``, ``Ev.REQUEUED``).
Each command first holds the run's control lock and finishes what a killed earlier command
left (``finish_holds``).

What each does on a live and on a stopped run:

- add: (``DirQueue.add_batch``) writes the new descriptors under hidden names (no fsync each),
  syncs once, journals ``added`` (naming the batch), renames them into pending/ and touches the
  ``added`` marker:
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
- requeue: any ended task (done included) back to pending as a fresh attempt series
  (``DirQueue.requeue``: held, saved, journaled, renamed; a cut-short one is finished by
  :func:`finish_adds`).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from gpuswarm.app import deps, groups, replies
from gpuswarm.config.commands import task_dumps
from gpuswarm.config.load import LoadedConfig, load_command_list, load_config, read_stdin
from gpuswarm.config.models import TaskOptions
from gpuswarm.core import verbs
from gpuswarm.core.errors import BadInputError, ConfigError, QueueError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor, State, base_name
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.core.verbs import Prerequisites as After
from gpuswarm.store import control
from gpuswarm.store.leases import is_live, registered_slot_ids
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.lookup import resolve_tasks, task_index
from gpuswarm.store.names import PRIORITY_LIMIT, corrupt_task_id, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.queuebase import note_added
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.runs import open_record

YAML_SUFFIXES = (".yaml", ".yml")
SHOWN_IDS = 100  # ids an ``added`` event (and add's output) lists at most


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
    info: RunRecord
    queue: DirQueue
    ledger: Ledger
    me: str
    after: list[Callable[[], None]] = field(default_factory=list)  # once the lock is released

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
    paths, info = open_record(run_dir)
    queue = DirQueue(paths)
    ledger = Ledger(paths.events)
    try:
        s = _Session(paths, info, queue, ledger, control.asker())
        with queue.control_lock():
            queue.finish_holds(s.announce_cancel)
            finish_adds(paths)
            result = body(s)
    finally:
        ledger.close()
    for then in s.after:
        then()
    return result


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


def _check_fits(dumps: Iterable[TaskDump], info: RunRecord, source: str) -> None:
    per_task = info.gpus_per_task
    for dump in dumps:
        gpus = dump.get("gpus")
        if isinstance(gpus, int) and gpus > per_task:
            raise ConfigError(
                f"{source}: task {dump.get('id')!r}: gpus {gpus} is more than this run's "
                f"gpus_per_task ({per_task}); its slots hold {per_task} GPU(s) each: lower gpus"
            )


def add_tasks(run_dir: Path, loaded: LoadedConfig, after: After | None = None) -> replies.AddReply:
    """Append ``loaded``'s tasks to a run (live or not; ``after``: prerequisites, issue 35)."""
    source = str(loaded.path) if loaded.path else "<stdin>"
    return execute(run_dir, verbs.Add(tuple(task_dumps(loaded.tasks)), source, **(after or {})))


def _add(s: _Session, req: verbs.Add) -> replies.AddReply:
    dumps = [dump.copy() for dump in req.tasks]
    _check_fits(dumps, s.info, req.source)
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
    added = deps.AddedDeps.of(req, s.paths, dumps, deps.fresh_ids(dumps, taken, deps.fresh_id))
    descs: list[Descriptor] = []
    for dump in dumps:
        original = str(dump["id"])
        tid = deps.fresh_id(original, taken)
        taken.add(tid)
        if tid != original:
            renamed[original] = tid
            dump["id"] = tid
        max_seq += 1
        descs.append(added.place(Descriptor.new(dump, max_seq)))  # blocked: issue 35
    ids = [desc.id for desc in descs]

    def journal(batch: str) -> None:  # names the batch: see DirQueue.finish_adds
        added.publish(s.paths)  # issue 35: edges known before the tasks are said or seen
        s.ledger.emit(
            Ev.ADDED, count=len(ids), ids=ids[:SHOWN_IDS], by=s.me, source=req.source,
            batch=batch, blocked=len(added.edges),  # issue 35: of them, waiting
        )  # fmt: skip
        s.ledger.sync()

    s.queue.add_batch(descs, journal)
    added.settle(s.queue, s.ledger)  # issue 35: after prerequisites that ended already
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


def finish_adds(paths: RunPaths) -> int:
    """Adds and requeues a crash cut short (their writer is dead), finished or undone
    (:meth:`DirQueue.finish_adds`, :meth:`DirQueue.finish_requeues`). Returns how many tasks
    were added."""
    queue = DirQueue(paths)

    def journaled() -> set[str]:
        return {
            str(e.get("batch")) for e in read_events(paths.events) if e.get("ev") == Ev.ADDED.value
        }

    added = queue.finish_adds(journaled)
    ledger: Ledger | None = None
    try:

        def announce(desc: Descriptor, frm: State) -> None:
            nonlocal ledger
            ledger = ledger or Ledger(paths.events)
            _requeue_announce(ledger, control.asker(), frm)(desc)

        if queue.finish_requeues(announce):
            note_added(paths)
    finally:
        if ledger is not None:
            ledger.close()
    return added


def _seq_of(name: str) -> int:
    digits = base_name(name)[4:13]
    return int(digits) if digits.isdigit() else -1


# -- cancel ----------------------------------------------------------------------------------
def cancel_tasks(
    run_dir: Path, args: Sequence[str], *, reason: str, wait: float | None
) -> replies.CancelReply:
    """Cancel tasks: pending ones now, running ones by a request (``wait`` seconds: block
    until they left running/). Each row: task, was, now, note."""
    return execute(run_dir, verbs.Cancel(tuple(args), reason, wait))


def _cancel(s: _Session, req: verbs.Cancel) -> replies.CancelReply:
    known, ids = _resolve(s, req.tasks)
    live = is_live(s.paths)
    rows: list[replies.TaskRow] = []
    for tid in ids:
        state, name = known[tid]
        row: replies.TaskRow = {"task": tid, "was": state.value, "now": state.value, "note": ""}
        gone, state, name = deps.cancel_blocked(s.queue, s.ledger, state, name, req.reason, s.me)
        if gone:
            rows.append({**row, "now": State.CANCELLED.value})  # issue 35: dependents follow
            continue  # (else: where it is now, a release moved it this instant: issue 35)
        state, attempt = control.request_cancel(
            s.queue, tid, state, name, req.reason, s.announce_cancel
        )
        row["was"] = State.PENDING.value if state is State.CANCELLED else state.value
        if state is State.CANCELLED:
            deps.cancelled(s.queue, s.ledger, tid)  # issue 35: its dependents follow
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
    result = replies.CancelReply(run=str(s.paths.root), tasks=rows, live=live, timed_out=False)
    asked = [r for r in rows if r["now"] == "cancel requested"]
    if req.wait is not None and asked and live:
        wait, paths = req.wait, s.paths

        def wait_left() -> None:  # outside the control lock: other commands go on meanwhile
            result["timed_out"] = not _wait_left_running(paths, asked, wait)

        s.after.append(wait_left)
    return result


def _wait_left_running(paths: RunPaths, rows: list[replies.TaskRow], timeout: float) -> bool:
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
) -> replies.RetryReply:
    """Failed / cancelled tasks (named, or every one with ``failed`` / ``cancelled``) back to
    pending with a fresh attempt budget."""
    return execute(run_dir, verbs.Retry(tuple(args), failed=failed, cancelled=cancelled))


def _retry(s: _Session, req: verbs.Retry) -> replies.RetryReply:
    known, ids = _resolve(s, req.tasks)
    deps.check_requeue(known, ids, "retry")  # issue 35: not a dependency_failed task
    for tid in ids:
        state = known[tid][0]
        if state in (State.DONE, State.SKIPPED):
            raise NotApplicableError(
                f"task {tid!r} is {state.value}: retry applies to failed or cancelled tasks"
            )
    wanted = set(ids)
    wanted |= {t for t, (st, _) in known.items() if req.failed and st is State.FAILED}
    wanted |= {t for t, (st, _) in known.items() if req.cancelled and st is State.CANCELLED}
    rows: list[replies.TaskRow] = []
    back = {t for t in wanted if known[t][0] in (State.FAILED, State.CANCELLED)}
    _drop_requests(s, back)
    gate = deps.Gate(s.queue, s.ledger, known, back, "retry", s.me)  # issue 35
    for tid in sorted(wanted):
        state, name = known[tid]
        row: replies.TaskRow = {"task": tid, "was": state.value, "now": state.value, "note": ""}
        if state in (State.FAILED, State.CANCELLED):
            gate.move(row, s.queue.retry, state, name, _retry_announce(s, state))
        else:
            row["note"] = f"{state.value}: not ended, nothing to do"
        rows.append(row)
    return _requeued(s, rows, gate)


def _requeued(s: _Session, rows: list[replies.TaskRow], gate: deps.Gate) -> replies.RetryReply:
    deps.retried(s.queue, s.ledger, rows)  # issue 35: dependency_failed dependents back
    gate.settle()
    if any(r["now"] == State.PENDING.value for r in rows):
        note_added(s.paths)
    live = is_live(s.paths)
    return {
        "run": str(s.paths.root),
        "tasks": rows,
        "retried": sum(1 for r in rows if r["now"] in deps.BACK),
        "live": live,
        "hint": "" if live or not rows else resume_hint(s.paths),
    }


# -- requeue ---------------------------------------------------------------------------------
def requeue_tasks(run_dir: Path, args: Sequence[str]) -> replies.RetryReply:
    """Ended tasks back to pending as a fresh attempt series (``verbs.Requeue``)."""
    return execute(run_dir, verbs.Requeue(tuple(args)))


def _requeue(s: _Session, req: verbs.Requeue) -> replies.RetryReply:
    known, ids = _resolve(s, req.tasks)
    deps.check_requeue(known, ids, "requeue")  # issue 35: as retry
    back = {t for t in ids if known[t][0].is_terminal()}
    _drop_requests(s, back)
    rows: list[replies.TaskRow] = []
    gate = deps.Gate(s.queue, s.ledger, known, back, "requeue", s.me)  # issue 35
    for tid in ids:
        state, name = known[tid]
        row: replies.TaskRow = {"task": tid, "was": state.value, "now": state.value, "note": ""}
        if not state.is_terminal():
            row["note"] = f"{state.value}: not ended, nothing to do"
        else:
            gate.move(row, s.queue.requeue, state, name, _requeue_announce(s.ledger, s.me, state))
        rows.append(row)
    return _requeued(s, rows, gate)


def _requeue_announce(ledger: Ledger, me: str, frm: State) -> Callable[[Descriptor], object]:
    def announce(desc: Descriptor) -> None:
        ledger.emit(
            Ev.CONTROL,
            request=verbs.Kind.REQUEUE.value,
            task=desc.id,
            by=me,
            applied_by=me,
            state=State.PENDING.value,
            frm=frm.value,
        )
        ledger.emit(Ev.REQUEUED, task=desc.id, frm=frm.value, reason="requeue")

    return announce


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
def set_paused(run_dir: Path, slot: str | None, *, paused: bool) -> replies.PauseReply:
    """Pause (or unpause) the run, or one slot (an id as ``status`` shows it)."""
    return execute(run_dir, verbs.Pause(slot) if paused else verbs.Unpause(slot))


def _pause(s: _Session, req: verbs.Pause | verbs.Unpause) -> replies.PauseReply:
    slot, paused = req.slot, req.kind is verbs.Kind.PAUSE
    if req.group is not None:  # issue 35: the group's flag
        return groups.set_group_paused(s.paths, req.group, paused=paused)
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
    if changed:  # a whole-run pause names no slot (a null slot is a line readers skip)
        where = {"slot": slot} if slot is not None else {}
        s.ledger.emit(Ev.CONTROL, request=req.kind.value, **where, by=s.me, applied_by=s.me)
    now = control.paused(s.paths)
    return {
        "run": str(s.paths.root),
        "slot": slot,
        "changed": changed,
        "paused": now.run,
        "paused_slots": sorted(now.slots),
        "live": is_live(s.paths),
    }


# -- priority --------------------------------------------------------------------------------
def set_priority(run_dir: Path, task: str, priority: int) -> replies.PriorityReply:
    """A pending task's new priority (higher runs first)."""
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise BadInputError(
            f"priority {priority}: use -{PRIORITY_LIMIT}..{PRIORITY_LIMIT} (higher runs first)"
        )
    return execute(run_dir, verbs.Priority(task, priority))


def _priority(s: _Session, req: verbs.Priority) -> replies.PriorityReply:
    priority = req.priority
    known, (tid,) = _resolve(s, [req.task])
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


# -- the verbs -------------------------------------------------------------------------------
Handler = Callable[[_Session, Any], replies.Reply]

#: one handler per verb (tests: every ``verbs.Kind`` has one)
HANDLERS: dict[verbs.Kind, Handler] = {
    verbs.Kind.ADD: _add,
    verbs.Kind.CANCEL: _cancel,
    verbs.Kind.RETRY: _retry,
    verbs.Kind.REQUEUE: _requeue,
    verbs.Kind.PAUSE: _pause,
    verbs.Kind.UNPAUSE: _pause,
    verbs.Kind.PRIORITY: _priority,
}


@overload
def execute(run_dir: Path, req: verbs.Add) -> replies.AddReply: ...
@overload
def execute(run_dir: Path, req: verbs.Cancel) -> replies.CancelReply: ...
@overload
def execute(run_dir: Path, req: verbs.Retry | verbs.Requeue) -> replies.RetryReply: ...
@overload
def execute(run_dir: Path, req: verbs.Pause | verbs.Unpause) -> replies.PauseReply: ...
@overload
def execute(run_dir: Path, req: verbs.Priority) -> replies.PriorityReply: ...
def execute(run_dir: Path, req: verbs.Verb) -> replies.Reply:
    """Apply one typed request to the run at ``run_dir`` by its kind's handler, under the run's
    control lock (what a killed earlier command left is finished first); what the handler
    leaves for later (``cancel --wait``) runs once the lock is released."""
    handler = HANDLERS[req.kind]  # a Cancel's or Retry's --group: its tasks named (issue 35)
    result: replies.Reply = _session(run_dir, lambda s: handler(s, groups.named(s.paths, req)))
    return result
