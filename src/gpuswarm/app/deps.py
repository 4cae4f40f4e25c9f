"""Dependencies in a person's queue changes (issue 35): ``gpuswarm add --after/--after-any/
--after-failed``, a cancel of a blocked task (and the dependents of a cancelled one), a retry
or requeue that brings dependency_failed dependents back (one of a dependency_failed task is
refused). :mod:`.control`'s handlers call these at one point each.

An added task with prerequisites is written like every added task (a hidden name in pending/,
one sync, the ``added`` event: ``DirQueue.add_batch``) and renamed into blocked/ instead of
pending/; its edge is appended to the edges file (synced) before the ``added`` line and any
rename makes it visible, so a supervisor that sees it knows its prerequisites. References in
an added YAML name the batch's own tasks first, then the run's (ids, names or unambiguous
prefixes, as TASK arguments are).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from gpuswarm.app.replies import TaskRow
from gpuswarm.core import faults, verbs
from gpuswarm.core.errors import BadInputError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths, check_task_id
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.store import release
from gpuswarm.store.blocked import Edge, verdict, write_edges
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.lookup import resolve_tasks, task_index
from gpuswarm.store.names import descriptor_name, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import open_run

Announce = Callable[[Descriptor], object]
Move = Callable[[State, str, Announce], "Descriptor | None"]  # DirQueue.retry / requeue
CANCEL_LOOKS = 200  # a move out of blocked/ takes well under 5 ms x 200
FLAG_FIELDS: dict[Literal["after", "after_any", "after_failed"], str] = {
    "after": "--after",
    "after_any": "--after-any",
    "after_failed": "--after-failed",
}


def run_task_ids(run_dir: Path) -> frozenset[str]:
    """The ids a run has (an added config's references may name them)."""
    paths, _ = open_run(run_dir)
    return frozenset(task_index(RunReader(paths)))


@dataclass
class AddedDeps:
    """The prerequisites an add gives its tasks, and the edges of those it writes blocked."""

    flags: dict[str, list[str]] = field(default_factory=dict)  # field -> ids (resolved)
    edges: list[Edge] = field(default_factory=list)

    @classmethod
    def of(
        cls, req: verbs.Add, paths: RunPaths, dumps: list[TaskDump], fresh: dict[str, str]
    ) -> AddedDeps:
        """The request's ``--after`` & co. on every task of ``dumps`` (:meth:`prepare`)."""
        flags = {"after": req.after, "after_any": req.after_any, "after_failed": req.after_failed}
        out = cls(flags={k: list(v) for k, v in flags.items()})
        out.prepare(paths, dumps, fresh)
        return out

    def prepare(self, paths: RunPaths, dumps: list[TaskDump], fresh: dict[str, str]) -> None:
        """The flags' prerequisites on every task; references to the batch's own tasks
        follow their new ids (``fresh``: original id -> id the add gives it)."""
        resolved = {k: resolve_tasks(paths, v) for k, v in self.flags.items() if v}
        for dump in dumps:
            for key in FLAG_FIELDS:
                refs = [fresh.get(r, r) for r in dump.get(key) or []]
                refs += [r for r in resolved.get(key, []) if r not in refs]
                if str(dump["id"]) in refs:
                    raise BadInputError(
                        f"{FLAG_FIELDS[key]}: task {dump['id']!r} cannot be after itself"
                    )
                dump[key] = refs

    def place(self, desc: Descriptor) -> Descriptor:
        """An added task with prerequisites is marked blocked (``DirQueue.add_batch`` renames
        it into blocked/), its edge kept for :meth:`publish`."""
        if desc.has_prerequisites:
            desc.mark_blocked()
            self.edges.append(Edge.of(desc, descriptor_name(desc.priority, desc.seq, desc.id)))
        return desc

    def publish(self, paths: RunPaths) -> None:
        """The edges on disk (synced) before any of their tasks becomes visible."""
        write_edges(paths, self.edges)

    def settle(self, queue: DirQueue, ledger: Ledger) -> None:
        """Once visible: those whose prerequisites ended already leave blocked/ now."""
        release.settle_added(queue, ledger, self.edges)


def fresh_ids(
    dumps: Iterable[TaskDump], taken: set[str], fresh: Callable[[str, set[str]], str]
) -> dict[str, str]:
    """The ids the add will give its tasks (``fresh``: its rule), without taking them."""
    seen = set(taken)
    out: dict[str, str] = {}
    for dump in dumps:
        tid = fresh(str(dump["id"]), seen)
        seen.add(tid)
        out[str(dump["id"])] = tid
    return out


def fresh_id(task_id: str, taken: set[str]) -> str:
    """``task_id``, or with the first suffix (-2, -3, ...) no task of the run has (add's rule)."""
    if task_id not in taken:
        return task_id
    n = 2
    while True:
        tail = f"-{n}"
        candidate = task_id[: 128 - len(tail)] + tail
        if candidate not in taken:
            return check_task_id(candidate)
        n += 1


def cancel_blocked(
    queue: DirQueue, ledger: Ledger, state: State, name: str, reason: str, me: str
) -> tuple[bool, State, str]:
    """``gpuswarm cancel`` of a blocked task: it ends cancelled now (journaled as from
    blocked), its dependents follow: (True, ...). Else (False, where the task is now): it
    was not blocked, or a release (or an end) took it out of blocked/ this instant: the
    caller cancels it where it went (pending -> cancelled), never "nothing to do"."""
    for _ in range(CANCEL_LOOKS):
        if state is not State.BLOCKED:
            return False, state, name
        faults.point("cancel.blocked.seen", task=task_id_of(name))
        if _cancel_blocked(queue, ledger, name, reason, me):
            return True, State.CANCELLED, name
        state, name = _where(queue, task_id_of(name))
    return False, State.RUNNING, ""  # never seen again: a request, whichever attempt runs


def _where(queue: DirQueue, task: str) -> tuple[State, str]:
    """Where ``task`` is now; a move out of blocked/ is on its way for a moment (a release's
    aside name): looked at again a few times."""
    for _ in range(CANCEL_LOOKS):
        for state in State:
            for name in queue.names(state):
                if task_id_of(name) == task:
                    return state, name
        time.sleep(0.005)
    return State.RUNNING, ""


def _cancel_blocked(queue: DirQueue, ledger: Ledger, name: str, reason: str, me: str) -> bool:

    def announce(desc: Descriptor) -> None:
        ledger.emit(
            Ev.CONTROL,
            request="cancel",
            task=desc.id,
            by=me,
            applied_by=me,
            state=State.CANCELLED.value,
            frm=State.BLOCKED.value,
            reason=reason,
        )

    return release.cancel_blocked(queue, ledger, name, reason, announce) is not None


def cancelled(queue: DirQueue, ledger: Ledger, task: str) -> int:
    """A pending task a cancel ended: its dependents follow (those it releases, counted)."""
    return release.released(queue, ledger, task, State.CANCELLED)


def check_requeue(known: Mapping[str, tuple[State, str]], ids: Iterable[str], verb: str) -> None:
    """A retry or requeue of a dependency_failed task is refused (exit 2): it never ran; it
    comes back when the prerequisite that failed is retried or requeued."""
    for tid in ids:
        if known[tid][0] is State.DEPENDENCY_FAILED:
            raise BadInputError(
                f"task {tid!r} is dependency_failed: {verb} the prerequisite that failed "
                "(its dependents come back with it)"
            )


BACK = frozenset({State.PENDING.value, State.BLOCKED.value})  # where a retry brings a task


class Gate:
    """A retry or requeue re-judges each task's prerequisites (issue 35): a task with
    prerequisites not all ended (one was requeued and is pending again, or goes back in this
    very batch) goes to blocked/, never pending/ (journaled: ``control`` with state blocked,
    then ``dependency``); once all moves are done :meth:`settle` releases those whose
    prerequisites ended meanwhile (after the move, a prerequisite's end settles them itself)."""

    def __init__(
        self,
        queue: DirQueue,
        ledger: Ledger,
        known: Mapping[str, tuple[State, str]],
        back: Iterable[str],
        verb: str,
        me: str,
    ) -> None:
        back = set(back)
        self.queue, self.ledger, self.verb, self.me = queue, ledger, verb, me
        self.states = {t: st.value for t, (st, _) in known.items() if t not in back}
        self.parked: list[Edge] = []

    def move(self, row: TaskRow, plain: Move, state: State, name: str, announce: Announce) -> None:
        """``plain`` (the usual move into pending/, ``announce`` journals it) when the task's
        prerequisites all ended (or it has none), else into blocked/; ``row`` says where it
        went (``now``), or that it was gone meanwhile (``note``)."""
        edge = release.index_of(self.queue.paths).edge(str(row["task"]))
        if edge is None or verdict(edge, self._ended)[0] is State.PENDING:
            desc, now = plain(state, name, announce), State.PENDING.value
        else:
            if edge.name != name:  # renamed since its edge was written (a priority change)
                edge = replace(edge, name=name)
                write_edges(self.queue.paths, [edge], durable=self.queue.durable)
            requeue = self.verb == "requeue"
            desc = release.park(self.queue, state, name, self._announce(state), requeue=requeue)
            if desc is not None:
                self.parked.append(edge)
            now = State.BLOCKED.value
        if desc is not None:
            row["now"] = now
        else:
            row["note"] = "gone meanwhile, or unreadable (see gpuswarm check)"

    def _ended(self, task: str) -> str | None:
        st = self.states.get(task)
        return st if st is not None and State(st).is_terminal() else None

    def _announce(self, frm: State) -> Callable[[Descriptor], object]:
        def announce(desc: Descriptor) -> None:
            blocked = State.BLOCKED.value
            self.ledger.emit(
                Ev.CONTROL,
                request=self.verb,
                task=desc.id,
                by=self.me,
                applied_by=self.me,
                state=blocked,
                frm=frm.value,
            )
            self.ledger.emit(
                Ev.DEPENDENCY,
                task=desc.id,
                frm=frm.value,
                state=blocked,
                reason=f"{self.verb}: waiting for its prerequisites",
                after=self.verb,
            )

        return announce

    def settle(self) -> None:
        """Those parked whose prerequisites ended meanwhile leave blocked/ now."""
        release.settle_added(self.queue, self.ledger, self.parked)


def retried(queue: DirQueue, ledger: Ledger, rows: Sequence[TaskRow]) -> int:
    """After a retry or a requeue: the end marks of the tasks now pending (or blocked) again
    go, their dependency_failed (and after_failed skipped) dependents, and theirs, are
    blocked again."""
    back = [str(r["task"]) for r in rows if r.get("now") in BACK]
    return release.retried(queue, ledger, back) if back else 0
