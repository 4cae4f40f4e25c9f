"""The durable directory queue: every transition of a descriptor (submit, claim, save, move,
requeue, retry, withdraw, reclaim, set aside), each save -> journal (the caller's ``announce``)
-> rename. File names are :mod:`gpuswarm.store.names`; the descriptor is
:class:`gpuswarm.core.models.Descriptor`; a staged run's folders are :mod:`gpuswarm.store.staging`.

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
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuswarm.core import faults
from gpuswarm.core.errors import LeaseLostError, QueueError
from gpuswarm.core.fsutil import (
    DirSyncer,
    atomic_write_bytes,
    dumps_compact,
    pid_alive,
    temp_writer_alive,
    write_temp,
)
from gpuswarm.core.models import Descriptor, State, base_name
from gpuswarm.core.paths import STATES, RunPaths
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.store.batches import QueueBatches
from gpuswarm.store.claimed import Claimed as Claimed  # re-exported: the queue hands them out
from gpuswarm.store.folders import visible
from gpuswarm.store.groupcommit import Grouped, commit_group
from gpuswarm.store.names import (
    claim_name,
    descriptor_name,
    reclaim_name,
    task_id_of,
)

Announce = Callable[[Descriptor], object]  # journals a transition between its save and rename
CLAIM_WINDOW = 64  # names a placement predicate may refuse in one claim (then: none fits now)


class DirQueue(QueueBatches):
    """One process's handle on a run's queue. Thread-safe; several processes may share a run."""

    def __init__(
        self,
        paths: RunPaths,
        *,
        durable: bool = True,
        on_corrupt: Callable[[str, str], object] | None = None,
    ) -> None:
        super().__init__(paths)
        self.durable = durable
        self.on_corrupt = on_corrupt  # (file name, reason): journals what a claim moved aside
        self._heap: list[str] = []
        self._lock = threading.Lock()
        self._loaded = False
        self._added_seen: int | None = None  # the ``added`` marker's mtime at the last scan
        self._claims = itertools.count(1)
        self._dir_sync = DirSyncer()  # slots finishing together share the folder fsync
        self._state_paths = {state: paths.state_dir(state) for state in STATES}  # made once
        self._added_path = str(paths.added_marker)  # a str, made once: one stat per claim
        self._local = threading.local()  # .dirs: folders whose fsync a batch defers; .group

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
        os.utime(dst)  # mtime = claim time, for status
        try:
            desc = Descriptor.loads(dst.read_bytes(), task_fields=False)  # the task: see _start
        except (OSError, ValueError) as exc:
            self.quarantine(dst, f"unreadable: {exc}")
            if self.on_corrupt is not None:
                self.on_corrupt(name, f"unreadable: {exc}")
            return None
        return Claimed(name=name, path=dst, data=desc.raw)

    # -- transitions of a claimed descriptor ---------------------------------------------------
    def save(self, claimed: Claimed) -> None:
        """Write the claimed descriptor's data in place (temp + fsync + rename), fenced: only
        while the lease file exists (LeaseLostError, nothing written, when it was renamed away)."""
        self._fenced_write(claimed, sync_dir=True)

    def _fenced_write(self, claimed: Claimed, *, sync_dir: bool) -> None:
        try:
            atomic_write_bytes(
                claimed.path,
                dumps_compact(claimed.data),
                durable=self.durable,
                sync_dir=sync_dir,
                fenced=True,
            )
        except FileNotFoundError:
            raise LeaseLostError(
                f"{claimed.path.name}: the lease is gone (another supervisor reclaimed the task)"
            ) from None

    def move(
        self,
        claimed: Claimed,
        state: State,
        announce: Callable[[], object] | None = None,
        *,
        after: Callable[[], object] | None = None,
        lost: Callable[[], object] | None = None,
    ) -> Path:
        """Save and move a claimed descriptor to ``state`` (pending, done or failed).

        Fenced: the save replaces the leased file only while it exists (LeaseLostError, nothing
        written or journaled, once a reclaimer renamed it away). The data is saved (with
        ``state``) first, then ``announce`` runs (it journals the transition), then the rename
        makes it true. A crash after the save leaves a running
        descriptor that says where it was going; recovery finishes a move to done/failed and
        journals it again, so the journal never lags behind the folders.

        ``after`` runs once the move is made. Inside :meth:`grouped_commit` a move given
        ``after`` and ``lost`` only writes its temp file here; the block's end makes every such
        file durable at once and then saves, announces and renames each in order, as here
        (``lost`` runs in place of LeaseLostError for a lease found gone then).
        """
        desc = claimed.desc
        desc.state = state
        desc.moved_from = claimed.path.name
        group: list[Grouped] | None = getattr(self._local, "group", None)
        if group is not None and after is not None and lost is not None and self.durable:
            data = dumps_compact(claimed.data)
            tmp = write_temp(claimed.path, data, durable=False, exclusive=True)
            faults.point("fsutil.temp_written", path=claimed.path, data=data)
            group.append(Grouped(claimed, state, tmp, announce, after, lost))
            return self._state_paths[state.value] / claimed.name
        self._fenced_write(claimed, sync_dir=False)  # LeaseLostError: nothing written
        dst = self._moved(claimed, state, announce)
        if after is not None:
            after()
        return dst

    def _moved(self, claimed: Claimed, state: State, announce: Callable[[], object] | None) -> Path:
        """The rest of a move once its descriptor is saved: announce, rename, folder sync."""
        faults.point("queue.move.saved", state=state.value)
        if announce is not None:
            announce()
        dst = self._state_paths[state.value] / claimed.name
        try:
            os.rename(claimed.path, dst)  # from the exact leased name: never re-creates it
        except FileNotFoundError:
            # a reclaimer renamed it after the save: it finds the begun move in the saved
            # descriptor and finishes it (journaled as recovered), so the outcome stands
            claimed.path = dst
            return dst
        if self.durable:
            deferred: set[Path] | None = getattr(self._local, "dirs", None)
            if deferred is not None:
                deferred.add(dst.parent)
            else:
                self._dir_sync.sync(dst.parent)
        claimed.path = dst
        if state is State.PENDING:
            self.push(claimed.name)
        return dst

    @contextlib.contextmanager
    def grouped_commit(self) -> Iterator[None]:
        """Group commit (:mod:`.groupcommit`): the moves this thread makes inside the block
        with ``after`` and ``lost`` share one flush of their saved descriptors."""
        group: list[Grouped] = []
        self._local.group = group
        try:
            yield
        finally:
            self._local.group = None
            commit_group(group, self._moved)

    @contextlib.contextmanager
    def batched_dir_syncs(self) -> Iterator[None]:
        """Moves made by this thread inside the block fsync each destination folder once, at
        its end (a crash before that loses only renames, which recovery redoes: the saved
        descriptor says where it was going)."""
        deferred: set[Path] = set()
        self._local.dirs = deferred
        try:
            yield
        finally:
            self._local.dirs = None
            for folder in deferred:
                self._dir_sync.sync(folder)

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

    def withdraw(self, task_id: str) -> bool:
        """Take a task out of pending/ before anyone claims it; False when it is not there
        (claimed meanwhile, or never queued). A claim and this rename cannot both win."""
        got = self._take(task_id, ".withdrawn-")
        if got is None:
            return False  # not there, or claimed this instant
        got[1].unlink()
        return True

    def _take(self, task_id: str, prefix: str) -> tuple[str, Path] | None:
        """Rename pending task ``task_id`` to ``pending/<prefix><name>``, out of the claimers'
        reach: (its name, where it is now); None when it is not pending (a claim and this
        rename cannot both win)."""
        pending = self.paths.state_dir("pending")
        for name in os.listdir(pending):
            if not visible(name) or task_id_of(name) != task_id:
                continue
            aside = pending / f"{prefix}{name}"
            try:
                os.rename(pending / name, aside)
            except FileNotFoundError:
                return None
            return name, aside
        return None

    def retry_failed(self, name: str, announce: Announce) -> Descriptor | None:
        """A failed task back to pending/ with a fresh attempt budget (see :meth:`retry`)."""
        return self.retry(State.FAILED, name, announce)

    def retry(self, state: State, name: str, announce: Announce) -> Descriptor | None:
        """A failed or cancelled task back to pending/ with a fresh attempt budget (its history
        kept): save (in its folder, marked as a begun retry), ``announce`` (journal), rename.
        None when it is unreadable or gone (another retry took it)."""
        if state not in RETRYABLE:
            raise ValueError(f"retry from {state.value}: only failed or cancelled tasks")
        src = self.paths.state_dir(state.value) / name
        desc = self.read_desc(state, name)
        if desc is None:
            return None
        desc.fresh_budget()
        staged = src.parent / f".retry-{base_name(name)}"
        atomic_write_bytes(staged, dumps_compact(desc.raw), durable=self.durable)
        os.replace(staged, src)  # one retrier at a time: callers hold control_lock()
        self._finish_retry(state, name, desc, announce)
        return desc

    @contextlib.contextmanager
    def control_lock(self) -> Iterator[None]:
        """The run's control lock (``.parallel/control.lock``): one retrier, canceller or
        re-prioritiser at a time, across processes (the CLI's control commands, recovery)."""
        fd = os.open(
            self.paths.parallel / "control.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def finish_begun_retry(
        self, name: str, announce: Announce, state: State = State.FAILED
    ) -> bool:
        """A failed (cancelled) task saved as ``pending`` (a retry a crash cut short after its
        save): announce it again (the journal never lags behind the folders) and finish the
        rename."""
        desc = self.read_desc(state, name)
        if desc is None or desc.state != State.PENDING.value:
            return False
        self._finish_retry(state, name, desc, announce)
        return True

    def _finish_retry(self, state: State, name: str, desc: Descriptor, announce: Announce) -> None:
        announce(desc)
        os.rename(self.paths.state_dir(state.value) / name, self.paths.state_dir("pending") / name)
        self.push(name)

    # -- a person's changes to pending tasks (gpuswarm cancel / priority) -------------------------
    def _hold(self, task_id: str, op: str) -> tuple[str, Path] | None:
        """Hold pending task ``task_id``: ``pending/.held-<op>-<pid>-<name>`` (see _take)."""
        return self._take(task_id, f"{HELD}{op}-{os.getpid()}-")

    def cancel_pending(self, task_id: str, reason: str, announce: Announce) -> Descriptor | None:
        """A pending task ends cancelled at once: held, marked, ``announce`` (journal),
        written to cancelled/, the hold removed. None when it is not pending (claimed
        meanwhile, or not there). A crash in between leaves the hold, which
        :meth:`finish_holds` completes (the journal says it, the folders follow)."""
        got = self._hold(task_id, "cancel")
        if got is None:
            return None
        name, held = got
        return self._cancel_held(name, held, Descriptor.loads(held.read_bytes()), reason, announce)

    def cancel_pending_if(
        self, task_id: str, decide: Callable[[Descriptor], str | None], announce: Announce
    ) -> Descriptor | None:
        """:meth:`cancel_pending` when ``decide(desc)`` gives a reason (a request that still
        applies to what the task is now); None: left pending as it was. The task is held as a
        look first (a crash then undoes the hold: :meth:`finish_holds`), as a cancel only once
        decided."""
        got = self._hold(task_id, "look")
        if got is None:
            return None
        name, held = got
        pending = self.paths.state_dir("pending")
        try:
            desc = Descriptor.loads(held.read_bytes())
            reason = decide(desc)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.replace(held, pending / name)
            raise
        cancel = pending / f"{HELD}cancel-{os.getpid()}-{name}"
        try:  # (FileNotFoundError: a finish_holds of this process undid the look meanwhile)
            os.replace(held, pending / name if reason is None else cancel)
        except FileNotFoundError:
            return None
        if reason is None:  # pending as it was
            self.push(name)
            note_added(self.paths)  # a claimer that met the hold dropped the name: rescan
            return None
        return self._cancel_held(name, cancel, desc, reason, announce)

    def _cancel_held(
        self, name: str, held: Path, desc: Descriptor, reason: str, announce: Announce
    ) -> Descriptor:
        desc.mark_cancelled(reason)
        announce(desc)
        self._write_ended(State.CANCELLED, name, desc)
        held.unlink()
        return desc

    def _write_ended(self, state: State, name: str, desc: Descriptor) -> None:
        folder = self.paths.state_dir(state.value)
        folder.mkdir(exist_ok=True)  # cancelled/ of a run made before it existed
        atomic_write_bytes(folder / name, dumps_compact(desc.raw), durable=self.durable)

    def reprioritize(self, task_id: str, priority: int, announce: Announce) -> str | None:
        """Pending task ``task_id`` gets ``priority`` (its name's rank: the claim order): held,
        changed, ``announce``, written under its new name, the hold removed. Returns the new
        name; None when it is not pending. Live supervisors see it at their next rescan."""
        got = self._hold(task_id, "prio")
        if got is None:
            return None
        _, held = got
        desc = Descriptor.loads(held.read_bytes())
        desc.set_priority(priority)
        new = descriptor_name(priority, desc.seq, task_id)
        announce(desc)
        atomic_write_bytes(
            self.paths.state_dir("pending") / new, dumps_compact(desc.raw), durable=self.durable
        )
        held.unlink()
        self.push(new)
        note_added(self.paths)  # live supervisors' heaps hold the old name: they rescan
        return new

    def finish_holds(self, announce_cancel: Announce) -> int:
        """Holds a crash cut short (their writer is dead): a cancel is finished (journaled
        again, written to cancelled/), a priority change or a cancel's look is undone (the
        task is pending under its old name). Returns how many were finished."""
        pending = self.paths.state_dir("pending")
        done = 0
        for held_name in os.listdir(pending):
            parsed = parse_hold(held_name)
            if parsed is None or (pid_alive(parsed[1]) and parsed[1] != os.getpid()):
                continue
            op, _, name = parsed
            held = pending / held_name
            try:
                desc = Descriptor.loads(held.read_bytes())
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:  # set aside where check reports it
                self.quarantine(held, f"unreadable: {exc}")
                continue
            ended = self.paths.state_dir(State.CANCELLED.value) / name
            if op == "cancel" and not ended.exists():
                desc.mark_cancelled(desc.reason or "cancelled")
                announce_cancel(desc)
                self._write_ended(State.CANCELLED, name, desc)
            elif op in ("prio", "look") and not any(
                task_id_of(n) == task_id_of(name) for n in os.listdir(pending) if visible(n)
            ):
                os.replace(held, pending / name)  # the change is undone: pending as it was
                self.push(name)
                done += 1
                continue
            held.unlink(missing_ok=True)
            done += 1
        return done

    def note_new_work(self) -> None:
        """Live supervisors look at pending/ again (:func:`note_added`)."""
        note_added(self.paths)


HELD = ".held-"  # pending/.held-<op>-<pid>-<name>: a task a person's change holds a moment
RETRYABLE = (State.FAILED, State.CANCELLED)


def parse_hold(file_name: str) -> tuple[str, int, str] | None:
    """``(op, pid, name)`` of a hold's file name; None for any other name."""
    if not file_name.startswith(HELD):
        return None
    op, _, rest = file_name[len(HELD) :].partition("-")
    pid, _, name = rest.partition("-")
    if op not in ("cancel", "prio", "look") or not pid.isdigit() or not name:
        return None
    return op, int(pid), name


def note_added(paths: RunPaths) -> None:
    """Tell live supervisors that pending/ has new work (tasks added, retried, reprioritized,
    a pause lifted): their keepers see it within a quick look and wake the loop, whose next
    claim rescans pending/."""
    marker = paths.added_marker
    now = time.time_ns()
    try:
        os.utime(marker, ns=(now, now))
    except FileNotFoundError:
        marker.touch()
        os.utime(marker, ns=(now, now))
