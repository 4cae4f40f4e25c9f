"""The frame every queue verb runs in (:mod:`gpuswarm.app.control`'s handlers): the run opened,
its control lock held, what a killed earlier command left finished first (holds, adds,
requeues), the TASK arguments resolved against the state folders, and the journal lines the
verbs share.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpuswarm.core import verbs
from gpuswarm.core.errors import BadInputError, QueueError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store import control
from gpuswarm.store.batches import journaled_batches
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.lookup import resolve_tasks, task_index
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.queuebase import note_added
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.runs import open_record

T = TypeVar("T")
INDEX_TRIES = 20  # scans of the state folders before a task in mid-move is given up on


class NotApplicableError(BadInputError):
    """A control request that does not apply to the task's state (exit 2)."""


def resume_hint(paths: RunPaths) -> str:
    return f"no supervisor is live: resume it: gpuswarm resume {paths.root}"


@dataclass
class Session:
    """One verb's run, queue and journal, under the control lock."""

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


def in_session(run_dir: Path, body: Callable[[Session], T]) -> T:
    """Open the run, hold the control lock, finish cut-short holds, run ``body``."""
    paths, info = open_record(run_dir)
    queue = DirQueue(paths)
    ledger = Ledger(paths.events)
    try:
        s = Session(paths, info, queue, ledger, control.asker())
        with queue.control_lock():
            queue.finish_holds(s.announce_cancel)
            finish_adds(paths)
            result = body(s)
    finally:
        ledger.close()
    for then in s.after:
        then()
    return result


def _index(queue: DirQueue) -> dict[str, tuple[State, str]]:
    """Task id -> (state, file name) from the folders' names (no descriptor read)."""
    return {tid: (hit.state, hit.file) for tid, hit in task_index(RunReader(queue.paths)).items()}


def resolve(s: Session, args: Sequence[str]) -> tuple[dict[str, tuple[State, str]], list[str]]:
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


def finish_adds(paths: RunPaths) -> int:
    """Adds and requeues a crash cut short (their writer is dead), finished or undone
    (:meth:`DirQueue.finish_adds`, :meth:`DirQueue.finish_requeues`). Returns how many tasks
    were added."""
    queue = DirQueue(paths)
    added = queue.finish_adds(lambda: journaled_batches(paths))
    ledger: Ledger | None = None
    try:

        def announce(desc: Descriptor, frm: State) -> None:
            nonlocal ledger
            ledger = ledger or Ledger(paths.events)
            requeue_announce(ledger, control.asker(), frm)(desc)

        if queue.finish_requeues(announce):
            note_added(paths)
    finally:
        if ledger is not None:
            ledger.close()
    return added


def requeue_announce(ledger: Ledger, me: str, frm: State) -> Callable[[Descriptor], object]:
    """The journal lines of a requeue (``control`` applied, ``requeued``), for ``announce``."""

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
