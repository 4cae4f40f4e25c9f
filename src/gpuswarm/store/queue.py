"""The durable directory queue: every transition of a descriptor (submit, claim, save, move,
requeue, retry, withdraw, reclaim, set aside), each save -> journal (the caller's ``announce``)
-> rename. :class:`DirQueue` claims and hands out leases; its mixins hold the other transitions:
:mod:`.moves` (a claimed descriptor saved and moved on, group commits), :mod:`.holds` (withdraw,
a person's cancel and priority change), :mod:`.retries`, :mod:`.batches` (add batches,
requeues); :mod:`.queuebase` is what they share. File names are :mod:`gpuswarm.store.names`; the
descriptor is :class:`gpuswarm.core.models.Descriptor`; a staged run's folders are
:mod:`gpuswarm.store.staging`.

Layout (under ``RunPaths.parallel``)::

    pending/<rank><seq>_<task-id>.json                 waiting; rank = 5000 - priority (4 digits)
    running/<rank><seq>_<task-id>.json@<owner>@<slot>  claimed; the lease is in the file name
    done/<rank><seq>_<task-id>.json                    finished successfully
    failed/<rank><seq>_<task-id>.json                  attempts used up
    skipped/, cancelled/                               ended, not failed (skip codes; a person)
    pending/.held-<op>-<pid>-<name>                    a cancel / priority change / look in flight
    corrupt/<name>.<reason>                            unreadable descriptors, moved aside

Every transition is one ``rename`` on one filesystem, so a descriptor is in exactly one state
folder at any time and two claimers can never both win (the loser's rename fails with ENOENT).
Names sort lexicographically in claim order (priority first, then submission order). A claim pops
the next name from an in-memory heap; the folder is scanned only when the heap runs dry or the
``added`` marker (touched by :meth:`DirQueue.add_pending`) changed, never per claim. Contents
change only in ``running/`` (temp + fsync + rename over the claimed file), before the descriptor
moves on.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuswarm.core import faults
from gpuswarm.core.errors import QueueError
from gpuswarm.core.fsutil import DirSyncer, atomic_write_bytes, dumps_compact, temp_writer_alive
from gpuswarm.core.models import Descriptor, State, base_name
from gpuswarm.core.paths import STATES, RunPaths
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.store.batches import QueueBatches
from gpuswarm.store.claimed import Claimed as Claimed  # re-exported: the queue hands them out
from gpuswarm.store.created import Created
from gpuswarm.store.folders import CLAIM_READ, read_all, visible
from gpuswarm.store.holds import QueueHolds
from gpuswarm.store.moves import QueueMoves
from gpuswarm.store.names import claim_name, descriptor_name, reclaim_name
from gpuswarm.store.queuebase import note_added
from gpuswarm.store.retries import QueueRetries

CLAIM_WINDOW = 64  # names a placement predicate may refuse in one claim (then: none fits now)


class DirQueue(QueueMoves, QueueHolds, QueueRetries, QueueBatches):
    """One process's handle on a run's queue. Thread-safe; several processes may share a run."""

    def __init__(
        self,
        paths: RunPaths,
        *,
        durable: bool = True,
        on_corrupt: Callable[[str, str], object] | None = None,
        created: Created | None = None,
    ) -> None:
        super().__init__(paths)
        self.durable = durable
        self.created = created  # the run's descriptors this process created (store/created.py)
        self.on_corrupt = on_corrupt  # (file name, reason): journals what a claim moved aside
        self._heap: list[str] = []
        self._lock = threading.Lock()
        self._loaded = False
        self._added_seen: int | None = None  # the ``added`` marker's mtime at the last scan
        self._claims = itertools.count(1)
        self._dir_sync = DirSyncer()  # slots finishing together share the folder fsync
        self._state_paths = {state: paths.state_dir(state) for state in STATES}  # made once
        self._added_path = str(paths.added_marker)  # a str, made once: one stat per claim
        self._local = threading.local()  # .dirs: fsyncs a batch defers; .group; .spares

    # -- submitting ----------------------------------------------------------------------------
    @staticmethod
    def add_pending(
        paths: RunPaths, task: TaskDump | dict[str, Any], seq: int, *, durable: bool = True
    ) -> str:
        """Add one task to a run that may be live (temp + fsync + rename into pending/), then
        touch the ``added`` marker so every supervisor's next claim re-reads pending/: a task
        added later with a higher priority is claimed before those already in their heaps."""
        desc = Descriptor.new(task, seq)
        path = paths.state_dir("pending") / descriptor_name(desc.priority, seq, desc.id)
        atomic_write_bytes(path, dumps_compact(desc.raw), durable=durable)
        note_added(paths)
        return path.name

    def submit(self, task: TaskDump | dict[str, Any], seq: int) -> str:
        """:meth:`add_pending` by this queue, which may claim it at once."""
        self.push(name := self.add_pending(self.paths, task, seq, durable=self.durable))
        return name

    # -- claiming ------------------------------------------------------------------------------
    def _added_mark(self) -> int | None:
        try:
            return os.stat(self._added_path).st_mtime_ns  # noqa: PTH116 - hot path, no Path
        except FileNotFoundError:
            return None

    def _refill(self) -> None:
        self._added_seen = self._added_mark()  # before the scan: an add during it rescans again
        names = [e.name for e in os.scandir(self.paths.state_dir("pending")) if visible(e.name)]
        heapq.heapify(names)
        self._heap = names
        self._loaded = True

    def push(self, name: str) -> None:
        """Tell this process's index that ``name`` (back) in pending/ may be claimed."""
        with self._lock:
            heapq.heappush(self._heap, name)

    def note_added_by_me(self) -> None:
        """:func:`note_added` for tasks this process pushed itself (issue 35: dependents it
        released): other supervisors rescan, this one's next claim does not (unless someone
        else touched the marker since its last scan)."""
        with self._lock:
            before = self._added_mark()
            note_added(self.paths)
            if self._loaded and before == self._added_seen:
                self._added_seen = self._added_mark()

    def claim(
        self, owner: str, slot: int, accept: Callable[[str], bool] | None = None
    ) -> Claimed | None:
        """Move the next pending descriptor to running/ under a lease; None if none is left.

        ``accept(name)``: a placement predicate (issue 19: does the task fit this slot's GPU
        now?). A refused name stays pending and in the heap; the next ones in claim order are
        asked instead, :data:`CLAIM_WINDOW` at most per claim (then None: nothing fits now)."""
        rescanned = False
        refused: list[str] = []
        try:
            while True:
                with self._lock:
                    if not self._loaded or self._added_mark() != self._added_seen:
                        self._refill()  # first claim, or tasks were added: one stat per claim
                        rescanned = True
                        refused.clear()  # the scan put them back
                    elif not self._heap and not rescanned:
                        self._refill()
                        rescanned = True
                        refused.clear()
                    if not self._heap:
                        return None
                    name = heapq.heappop(self._heap)
                if accept is not None and not accept(name):
                    refused.append(name)
                    if len(refused) >= CLAIM_WINDOW:
                        return None
                    continue
                claimed = self._try_claim(name, owner, slot)
                if claimed is not None:
                    faults.point("queue.claimed")
                    return claimed
        finally:
            if refused:
                with self._lock:
                    for name in refused:
                        heapq.heappush(self._heap, name)

    def _try_claim(self, name: str, owner: str, slot: int) -> Claimed | None:
        src = f"{self._state_paths['pending']}/{name}"  # a str: the hot path makes one Path, dst
        # the claim number makes each claim's name unique, so recovery can tell a move this
        # claim began (``moved_from`` == its name) from one an earlier claim finished
        dst = self._state_paths["running"] / claim_name(name, owner, slot, next(self._claims))
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return None  # another claimer won
        try:  # one open: what was put in pending/ may be a FIFO or a symlink (never followed)
            fd = os.open(dst, CLAIM_READ)
            try:
                os.utime(fd)  # mtime = claim time, for status
                data = read_all(fd)
            finally:
                os.close(fd)
            desc = Descriptor.loads(data, task_fields=False)  # the task: see _start
        except (OSError, ValueError, RecursionError) as exc:
            self.quarantine(dst, f"unreadable: {exc}")
            if self.on_corrupt is not None:
                self.on_corrupt(name, f"unreadable: {exc}")
            return None
        return Claimed(name=name, path=dst, data=desc.raw)

    # -- leases taken over, descriptors set aside ----------------------------------------------
    def quarantine(self, path: Path, reason: str) -> Path:
        """Move an unreadable descriptor out of the state folders, with the reason in its name."""
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in reason)[:80]
        dst = self.paths.corrupt / f"{path.name}.{safe}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, dst)
        return dst

    def adopt_running(self, name: str) -> Claimed:
        """Take over a running descriptor (recovery); raises QueueError if it cannot be read."""
        path = self.paths.state_dir("running") / name
        desc = self.read_desc(State.RUNNING, name)
        if desc is None:
            raise QueueError(f"{path}: unreadable running descriptor")
        return Claimed(name=base_name(name), path=path, data=desc.raw)

    def take_lease(self, name: str, me: str) -> str | None:
        """Rename a dead owner's running ``name`` to a reclaimer's lease of ``me``, which
        :func:`reclaim_name` makes encode the claim; the rename arbitrates between reclaimers
        (None: another won). Returns the new name (then :meth:`adopt_running` it)."""
        mine = reclaim_name(name, me)
        try:
            os.rename(self.running_path(name), self.running_path(mine))
        except FileNotFoundError:
            return None  # another supervisor reclaimed it first
        return mine

    # -- transitions of descriptors no process holds -------------------------------------------
    def update_pending(self, name: str, task: TaskDump | dict[str, Any]) -> None:
        """Give a pending task a new spec (a config change, under the run lock)."""
        desc = self.read_desc(State.PENDING, name) or Descriptor({})
        desc.task = task
        path = self.paths.state_dir("pending") / name
        atomic_write_bytes(path, dumps_compact(desc.raw), durable=self.durable)

    def remove_cut_writes(self) -> int:
        """Temp files in pending/ whose writer is dead (writes a crash cut short; a live
        supervisor may be re-queueing an attempt right now). Returns how many went."""
        pending = self.paths.state_dir("pending")
        cut = [n for n in os.listdir(pending) if n.startswith(".tmp-") and not temp_writer_alive(n)]
        for name in cut:
            (pending / name).unlink(missing_ok=True)
        return len(cut)

    @contextlib.contextmanager
    def control_lock(self) -> Iterator[None]:
        """The run's control lock (``RunPaths.control_lock``): one retrier, canceller or
        re-prioritiser at a time, across processes (the CLI's control commands, recovery)."""
        fd = os.open(self.paths.control_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
