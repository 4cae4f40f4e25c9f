"""Releasing dependents (issue 35): what happens to the tasks after one that ended.

:func:`released` is the one call whoever commits an end makes (the committer, a cancel): the end
mark first, then each dependent of the reverse index settled by :func:`~.blocked.verdict`, and
the dependents of those that ended (dependency_failed, skipped) in turn: a failure at the head
of a chain of 100 ends the 99 after it at once. O(dependents): nothing is scanned.

:func:`settle_all` is recovery's: with no supervisor half-way (resume, ``check --repair``) or
after a supervisor died (a reclaim), every blocked task is settled again against the folders,
the end marks are written again from them, and a dependency_failed task whose failed
prerequisite was retried meanwhile is blocked again. :func:`retried` brings the dependents of
retried tasks back (``gpuswarm retry``); :func:`cancel_blocked` ends a blocked task cancelled.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from gpuswarm.core import faults
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.store.blocked import (
    BlockedFolder,
    Edge,
    EdgeIndex,
    ended_state,
    mark_ended,
    unmark,
    verdict,
    write_edges,
)
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.lookup import task_index
from gpuswarm.store.names import descriptor_name, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader

_INDEXES: dict[Path, EdgeIndex] = {}
_LOCK = threading.Lock()


def index_of(paths: RunPaths) -> EdgeIndex:
    """This process's reverse index of a run (read once, then only the edges file's new
    lines)."""
    with _LOCK:
        found = _INDEXES.get(paths.root)
        if found is None:
            found = _INDEXES[paths.root] = EdgeIndex(paths)
        return found


def _announce(ledger: Ledger, edge: Edge, to: State, after: str) -> Callable[[Descriptor], object]:
    if to is State.PENDING:
        return lambda d: ledger.emit(
            Ev.REQUEUED, task=edge.task, frm=State.BLOCKED.value, reason="released", after=after
        )
    return lambda d: ledger.emit(
        Ev.DEPENDENCY,
        task=edge.task,
        frm=State.BLOCKED.value,
        state=to.value,
        reason=d.reason,
        after=after,
    )


def released(queue: DirQueue, ledger: Ledger, task: str, state: State) -> int:
    """``task`` ended ``state``: its dependents are settled (and theirs, when they end).
    Returns how many went to pending/ (this queue's claims see them at once)."""
    paths = queue.paths
    index = index_of(paths)
    if not index.of(task):
        return 0  # no dependents: no mark either (one stat of the edges file)
    folder = BlockedFolder(paths, durable=queue.durable)
    work = [(task, state)]
    count = 0
    while work:
        pre, st = work.pop()
        dependents = index.of(pre)
        if any(len(e.prerequisites()) > 1 for e in dependents):
            mark_ended(paths, pre, st)  # read by the verdicts of those with several
        faults.point("release.marked", task=pre)
        for edge in dependents:
            to, why = verdict(edge, functools.partial(_state_of, paths, pre, st))
            if to is None:
                continue
            desc = folder.settle(edge.name, to, why or None, _announce(ledger, edge, to, pre))
            if desc is None:
                continue  # another settler (or a cancel) took it
            if to is State.PENDING:
                queue.push(edge.name)
                count += 1
            else:
                work.append((edge.task, to))
    if count:
        queue.note_added_by_me()  # other supervisors' next claims look again
    return count


def _state_of(paths: RunPaths, pre: str, state: State, task: str) -> str | None:
    """How ``task`` ended: ``state`` for the one just ended, else its end mark."""
    return state.value if task == pre else ended_state(paths, task)


def cancel_blocked(
    queue: DirQueue,
    ledger: Ledger,
    name: str,
    reason: str,
    announce: Callable[[Descriptor], object],
) -> Descriptor | None:
    """A blocked task ends cancelled (``gpuswarm cancel``); its dependents follow."""
    desc = BlockedFolder(queue.paths, durable=queue.durable).settle(
        name, State.CANCELLED, reason, announce
    )
    if desc is not None:
        released(queue, ledger, desc.id, State.CANCELLED)
    return desc


def retried(queue: DirQueue, ledger: Ledger, tasks: Iterable[str]) -> int:
    """Tasks going back to pending/ (a retry): their end marks go first, then their
    dependency_failed dependents (and theirs) are blocked again. Returns how many."""
    paths = queue.paths
    index = index_of(paths)
    folder = BlockedFolder(paths, durable=queue.durable)
    work = list(tasks)
    for task in work:
        unmark(paths, task)
    count = 0
    while work:
        pre = work.pop()
        for edge in index.of(pre):
            frm = _came_of(paths, edge, pre)
            if frm is None:
                continue
            announce = _back(ledger, edge.task, pre, frm)
            if folder.block_again(frm, edge.name, announce) is not None:
                unmark(paths, edge.task)
                work.append(edge.task)
                count += 1
    return count


def _came_of(paths: RunPaths, edge: Edge, pre: str) -> State | None:
    """Where a dependent that ``pre``'s end settled is: dependency_failed/, or skipped/ when
    ``pre`` is one of its ``after_failed:`` (it did not fail: the dependent was skipped)."""
    if (paths.state_dir(State.DEPENDENCY_FAILED.value) / edge.name).exists():
        return State.DEPENDENCY_FAILED
    if pre in edge.after_failed and (paths.state_dir(State.SKIPPED.value) / edge.name).exists():
        return State.SKIPPED
    return None


def _back(
    ledger: Ledger, task: str, after: str, frm: State = State.DEPENDENCY_FAILED
) -> Callable[[Descriptor], object]:
    return lambda d: ledger.emit(
        Ev.DEPENDENCY,
        task=task,
        frm=frm.value,
        state=State.BLOCKED.value,
        reason="its prerequisites have not all ended"
        if after == "recovery"
        else f"prerequisite {after} retried",
        after=after,
    )


def park(
    queue: DirQueue,
    state: State,
    name: str,
    announce: Callable[[Descriptor], object],
    *,
    requeue: bool,
) -> Descriptor | None:
    """An ended task a retry (``requeue``: a requeue) brings back while its prerequisites
    have not all ended: with its fresh budget into blocked/, never pending/ (settle it
    after: :func:`settle_added`)."""

    def fresh(desc: Descriptor) -> None:
        desc.fresh_budget()
        if requeue:
            desc.result = None

    folder = BlockedFolder(queue.paths, durable=queue.durable)
    return folder.block_again(state, name, announce, prepare=fresh)


def submit(queue: DirQueue, task: TaskDump, seq: int) -> str:
    """:meth:`DirQueue.submit`, except that a task with prerequisites goes to blocked/ (its
    edge written first): a config change adding tasks on resume (settle them after)."""
    desc = Descriptor.new(task, seq)
    if not desc.has_prerequisites:
        return queue.submit(task, seq)
    name = descriptor_name(desc.priority, seq, desc.id)
    desc.mark_blocked()
    write_edges(queue.paths, [Edge.of(desc, name)], durable=queue.durable)
    folder = queue.paths.state_dir(State.BLOCKED.value)
    folder.mkdir(exist_ok=True)
    atomic_write_bytes(folder / name, dumps_compact(desc.raw), durable=queue.durable)
    return name


def settle_locked(queue: DirQueue, ledger: Ledger, *, only: bool = True) -> dict[str, int]:
    """:func:`settle_all` under the run's control lock, when ``only`` (a supervisor joining a
    run, ``work``: a release a dead one left half-way; after a config change or a reclaim)."""
    if not only:
        return {}
    with queue.control_lock():
        return settle_all(queue, ledger)


# -- recovery ----------------------------------------------------------------------------------
def settle_all(queue: DirQueue, ledger: Ledger) -> dict[str, int]:
    """Settle every blocked task against the folders (a scan: recovery's, never per task)."""
    paths = queue.paths
    folder = BlockedFolder(paths, durable=queue.durable)
    out = {"finished": folder.finish_cut(lambda d, to: _recovered(ledger, d, to))}
    out["blocked_again"] = _finish_block_again(queue, ledger)
    states = {task_id_of(n): s.value for s in State for n in queue.names(s)}
    out["blocked_again"] += _reblock_pending(queue, ledger, states)
    edges = _edges(queue, paths)
    out["blocked_again"] += _unfail(queue, ledger, edges, states)
    index = index_of(paths)
    for pre in list(index.dependents):
        st = states.get(pre)
        if st is not None and State(st).is_terminal():
            mark_ended(paths, pre, State(st))
        else:
            unmark(paths, pre)
    work = [e for e in edges.values() if states.get(e.task) == State.BLOCKED.value]
    out.update(_settle(queue, ledger, work, states, "recovery"))
    return out


def settle_added(queue: DirQueue, ledger: Ledger, edges: list[Edge]) -> dict[str, int]:
    """Tasks an add just made visible in blocked/: those whose prerequisites had ended
    before are settled now (a prerequisite ending meanwhile settles them itself)."""
    if not edges:
        return {"released": 0, "ended": 0}
    states = {tid: hit.state.value for tid, hit in task_index(RunReader(queue.paths)).items()}
    return _settle(queue, ledger, list(edges), states, "added")


def _settle(
    queue: DirQueue, ledger: Ledger, work: list[Edge], states: dict[str, str], why: str
) -> dict[str, int]:
    """Settle ``work`` by ``states`` (task id -> state folder), and the dependents of those
    that end, in turn."""
    paths = queue.paths
    folder = BlockedFolder(paths, durable=queue.durable)
    index = index_of(paths)
    out = {"released": 0, "ended": 0}
    while work:
        edge = work.pop()
        to, reason = verdict(edge, functools.partial(_ended, states))
        if to is None:
            continue
        desc = folder.settle(edge.name, to, reason or None, _announce(ledger, edge, to, why))
        if desc is None:
            continue
        states[edge.task] = to.value
        if to is State.PENDING:
            queue.push(edge.name)
            out["released"] += 1
            continue
        out["ended"] += 1
        mark_ended(paths, edge.task, to)
        work += [e for e in index.of(edge.task) if states.get(e.task) == State.BLOCKED.value]
    if out["released"]:
        queue.note_added_by_me()
    return out


def _ended(states: dict[str, str], task: str) -> str | None:
    st = states.get(task)
    return st if st is not None and State(st).is_terminal() else None


def _recovered(ledger: Ledger, desc: Descriptor, to: State) -> None:
    ledger.emit(Ev.RECOVERED, task=desc.id, state=to.value, frm=State.BLOCKED.value)


def _edges(queue: DirQueue, paths: RunPaths) -> dict[str, Edge]:
    """Every blocked or dependency_failed task's edge, from its descriptor (the truth); one
    the edges file lacks is appended to it (repair)."""
    index = index_of(paths)
    out: dict[str, Edge] = {}
    missing: list[Edge] = []
    for state in (State.BLOCKED, State.DEPENDENCY_FAILED):
        for name, desc in queue.iter_descs(state):
            edge = Edge.of(desc, name)
            out[edge.task] = edge
            if index.edge(edge.task) != edge:
                missing.append(edge)
    if missing:
        write_edges(paths, missing, durable=queue.durable)
        index.refresh()
    return out


def _unfail(queue: DirQueue, ledger: Ledger, edges: dict[str, Edge], states: dict[str, str]) -> int:
    """A dependency_failed task none of whose prerequisites failed any more (one was
    retried: pending again) is blocked again, and then its dependents are looked at too."""
    folder = BlockedFolder(queue.paths, durable=queue.durable)
    index = index_of(queue.paths)
    failed = State.DEPENDENCY_FAILED.value
    work = [e for e in edges.values() if states.get(e.task) == failed]
    count = 0
    while work:
        edge = work.pop()
        if states.get(edge.task) != failed:
            continue
        to, _ = verdict(edge, lambda t: _ended(states, t))
        if to is State.DEPENDENCY_FAILED:
            continue
        announce = _back(ledger, edge.task, "recovery")
        if folder.block_again(State.DEPENDENCY_FAILED, edge.name, announce) is not None:
            states[edge.task] = State.BLOCKED.value
            count += 1
            work += [e for e in index.of(edge.task) if states.get(e.task) == failed]
    return count


def _finish_block_again(queue: DirQueue, ledger: Ledger) -> int:
    """An ended descriptor saved as blocked (a retry's bring-back, or a retry of a task whose
    prerequisites had not ended, cut short)."""
    folder = BlockedFolder(queue.paths, durable=queue.durable)
    count = 0
    for state in sorted(State.terminal(), key=lambda st: st.value):
        for name, desc in queue.iter_descs(state):
            if desc.state == State.BLOCKED.value:
                announce = _back(ledger, desc.id, "recovery", state)
                if folder.block_again(state, name, announce) is not None:
                    count += 1
    return count


def _reblock_pending(queue: DirQueue, ledger: Ledger, states: dict[str, str]) -> int:
    """A pending task whose prerequisites have not all ended (a failed one retried by resume
    with its prerequisite retried too, a move cut short) back to blocked/: no supervisor
    claims meanwhile (recovery holds the run). Only tasks with edges are looked at."""
    index = index_of(queue.paths)
    folder = BlockedFolder(queue.paths, durable=queue.durable)
    count = 0
    for name in queue.names(State.PENDING):
        edge = index.edge(task_id_of(name))
        if edge is None or verdict(edge, functools.partial(_ended, states))[0] is State.PENDING:
            continue
        desc = queue.read_desc(State.PENDING, name)
        if desc is None:
            continue
        if name != edge.name:
            write_edges(queue.paths, [Edge.of(desc, name)], durable=queue.durable)
        folder.block_pending(name, desc, _back(ledger, desc.id, "recovery", State.PENDING))
        states[desc.id] = State.BLOCKED.value
        count += 1
    return count
