"""The durable directory queue: enqueue, claim, update, requeue, finish, recover.

Layout (under ``RunPaths.parallel``)::

    pending/<rank><seq>_<task-id>.json                 waiting; rank = 5000 - priority (4 digits)
    running/<rank><seq>_<task-id>.json@<owner>@<slot>  claimed; the lease is in the file name
    done/<rank><seq>_<task-id>.json                    finished successfully
    failed/<rank><seq>_<task-id>.json                  attempts used up
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
import ctypes
import ctypes.util
import heapq
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from gpuswarm.core import faults
from gpuswarm.core.errors import LeaseLostError, QueueError
from gpuswarm.core.fsutil import DirSyncer, atomic_write_bytes, dumps_compact
from gpuswarm.core.paths import STATES, RunPaths
from gpuswarm.core.records import descriptor_problem

DESCRIPTOR_VERSION = 1
PRIORITY_LIMIT = 4999
LEASE_SEP = "@"


class State(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # ended without counting as a failure (skip_exit_code, exclude:)


def descriptor_name(priority: int, seq: int, task_id: str) -> str:
    """``<rank><seq>_<task-id>.json``: lexicographic order = higher priority, then earlier seq."""
    if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
        raise ValueError(f"priority {priority} outside -{PRIORITY_LIMIT}..{PRIORITY_LIMIT}")
    return f"{5000 - priority:04d}{seq:09d}_{task_id}.json"


def base_name(file_name: str) -> str:
    """The descriptor name without a lease suffix."""
    return file_name.split(LEASE_SEP, 1)[0]


def lease_of(file_name: str) -> tuple[str, int] | None:
    """``(owner, slot)`` encoded in a running descriptor's name (``@owner@slot.claim``)."""
    parts = file_name.split(LEASE_SEP)
    if len(parts) != 3:
        return None
    try:
        return parts[1], int(parts[2].split(".", 1)[0])
    except ValueError:
        return None


def task_id_of(file_name: str) -> str:
    stem = base_name(file_name)
    return stem[14:-5] if stem.endswith(".json") else stem[14:]


def corrupt_task_id(name: str) -> str | None:
    """The task id of a file in corrupt/ (``<descriptor name>[@lease].<reason>``)."""
    end = name.find(".json")
    return name[14:end] if end > 14 else None


def _visible(name: str) -> bool:
    return not name.startswith(".")


@dataclass
class Claimed:
    """A descriptor this process holds in ``running/``."""

    name: str  # base name, no lease
    path: Path  # current path in running/
    data: dict[str, Any]

    @property
    def task_id(self) -> str:
        return str(self.data["id"])


def new_descriptor(task: dict[str, Any], seq: int) -> dict[str, Any]:
    return {
        "v": DESCRIPTOR_VERSION,
        "id": task["id"],
        "seq": seq,
        "task": task,
        "attempts": [],
        "budget_from": 0,
        "interruptions": 0,
        "reason": None,
        "state": State.PENDING.value,
    }


def attempts_used(data: dict[str, Any]) -> int:
    """Attempts that count against ``max_attempts`` (interrupted ones and earlier budgets don't)."""
    counted = [
        a for a in data["attempts"][data.get("budget_from", 0) :] if not a.get("interrupted")
    ]
    return len(counted)


class DirQueue:
    """One process's handle on a run's queue. Thread-safe; several processes may share a run."""

    def __init__(
        self,
        paths: RunPaths,
        *,
        durable: bool = True,
        on_corrupt: Callable[[str, str], object] | None = None,
    ) -> None:
        self.paths = paths
        self.durable = durable
        self.on_corrupt = on_corrupt  # (file name, reason): journals what a claim moved aside
        self._heap: list[str] = []
        self._lock = threading.Lock()
        self._loaded = False
        self._added_seen: int | None = None  # the ``added`` marker's mtime at the last scan
        self._claims = itertools.count(1)
        self._dir_sync = DirSyncer()  # slots finishing together share the folder fsync
        self._local = threading.local()  # .dirs: folders whose fsync a batch defers

    # -- creation ------------------------------------------------------------------------------
    @staticmethod
    def create_layout(paths: RunPaths) -> None:
        paths.parallel.mkdir(parents=True, exist_ok=True, mode=0o700)
        for state in STATES:
            paths.state_dir(state).mkdir(exist_ok=True)
        paths.corrupt.mkdir(exist_ok=True)

    @staticmethod
    def write_pending(paths: RunPaths, descriptors: Iterable[dict[str, Any]]) -> int:
        """Write descriptors into ``pending/`` of a run being staged (not yet visible).

        No per-file fsync: the caller syncs the filesystem once (:func:`sync_tree`) before it
        makes the staged run visible with a rename, so 100k tasks cost one sync, not 100k.
        """
        count = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        folder = os.open(paths.state_dir("pending"), os.O_RDONLY | os.O_DIRECTORY)
        skipped = paths.state_dir(State.SKIPPED.value)
        try:
            for desc in descriptors:
                name = descriptor_name(desc["task"].get("priority", 0), desc["seq"], desc["id"])
                if desc.get("state") == State.SKIPPED.value:  # excluded: never pending
                    atomic_write_bytes(skipped / name, dumps_compact(desc), durable=False)
                    count += 1
                    continue
                fd = os.open(name, flags, 0o644, dir_fd=folder)  # no path to build or walk
                try:
                    os.write(fd, dumps_compact(desc))  # a few hundred bytes: one write
                finally:
                    os.close(fd)
                count += 1
        finally:
            os.close(folder)
        return count

    @staticmethod
    def add_pending(
        paths: RunPaths, task: dict[str, Any], seq: int, *, durable: bool = True
    ) -> str:
        """Add one task to a run that may be live (temp + fsync + rename into pending/), then
        touch the ``added`` marker so every supervisor's next claim re-reads pending/: a task
        added later with a higher priority is claimed before those already in their heaps."""
        desc = new_descriptor(task, seq)
        name = descriptor_name(int(task.get("priority", 0)), seq, str(task["id"]))
        atomic_write_bytes(paths.state_dir("pending") / name, dumps_compact(desc), durable=durable)
        note_added(paths)
        return name

    # -- claiming ------------------------------------------------------------------------------
    def _added_mark(self) -> int | None:
        try:
            return (self.paths.parallel / ADDED_MARKER).stat().st_mtime_ns
        except FileNotFoundError:
            return None

    def _refill(self) -> None:
        self._added_seen = self._added_mark()  # before the scan: an add during it rescans again
        names = [e.name for e in os.scandir(self.paths.state_dir("pending")) if _visible(e.name)]
        heapq.heapify(names)
        self._heap = names
        self._loaded = True

    def push(self, name: str) -> None:
        """Tell this process's index that ``name`` (back) in pending/ may be claimed."""
        with self._lock:
            heapq.heappush(self._heap, name)

    def claim(self, owner: str, slot: int) -> Claimed | None:
        """Move the next pending descriptor to running/ under a lease; None if none is left."""
        rescanned = False
        while True:
            with self._lock:
                if not self._loaded or self._added_mark() != self._added_seen:
                    self._refill()  # first claim, or tasks were added: one stat per claim
                    rescanned = True
                elif not self._heap and not rescanned:
                    self._refill()
                    rescanned = True
                if not self._heap:
                    return None
                name = heapq.heappop(self._heap)
            claimed = self._try_claim(name, owner, slot)
            if claimed is not None:
                faults.point("queue.claimed")
                return claimed

    def _try_claim(self, name: str, owner: str, slot: int) -> Claimed | None:
        src = self.paths.state_dir("pending") / name
        # the claim number makes each claim's name unique, so recovery can tell a move this
        # claim began (``moved_from`` == its name) from one an earlier claim finished
        lease = f"{LEASE_SEP}{owner}{LEASE_SEP}{slot}.{next(self._claims)}"
        dst = self.paths.state_dir("running") / f"{name}{lease}"
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            return None  # another claimer won
        os.utime(dst)  # mtime = claim time, for status
        try:
            data = json.loads(dst.read_bytes())
            problem = descriptor_problem(data, task_fields=False)  # the task: see _start
            if problem is not None:
                raise ValueError(problem)
        except (OSError, ValueError) as exc:
            self.quarantine(dst, f"unreadable: {exc}")
            if self.on_corrupt is not None:
                self.on_corrupt(name, f"unreadable: {exc}")
            return None
        return Claimed(name=name, path=dst, data=data)

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
        self, claimed: Claimed, state: State, announce: Callable[[], object] | None = None
    ) -> Path:
        """Save and move a claimed descriptor to ``state`` (pending, done or failed).

        Fenced: the save replaces the leased file only while it exists (LeaseLostError, nothing
        written or journaled, once a reclaimer renamed it away). The data is saved (with
        ``state``) first, then ``announce`` runs (it journals the transition), then the rename
        makes it true. A crash after the save leaves a running
        descriptor that says where it was going; recovery finishes a move to done/failed and
        journals it again, so the journal never lags behind the folders.
        """
        claimed.data["state"] = state.value
        claimed.data["moved_from"] = claimed.path.name
        self._fenced_write(claimed, sync_dir=False)  # LeaseLostError: nothing written
        faults.point("queue.move.saved", state=state.value)
        if announce is not None:
            announce()
        dst = self.paths.state_dir(state.value) / claimed.name
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

    # -- inspection ----------------------------------------------------------------------------
    def names(self, state: State) -> list[str]:
        try:
            entries = os.scandir(self.paths.state_dir(state.value))
        except FileNotFoundError:  # skipped/ of a run made before it existed
            return []
        with entries:
            return sorted(e.name for e in entries if _visible(e.name))

    def counts(self) -> dict[State, int]:
        out: dict[State, int] = {}
        for state in State:
            try:
                it = os.scandir(self.paths.state_dir(state.value))
            except FileNotFoundError:  # skipped/ of a run made before it existed
                out[state] = 0
                continue
            with it:
                out[state] = sum(1 for e in it if _visible(e.name))
        return out

    def read(self, state: State, name: str) -> dict[str, Any] | None:
        """The descriptor, or None when it is unreadable, not JSON or mistyped (a record with
        ``"attempts": "x"`` is as unusable as an empty file: every reader reports it)."""
        try:
            data = json.loads((self.paths.state_dir(state.value) / name).read_bytes())
        except (OSError, ValueError, RecursionError):
            return None
        return data if descriptor_problem(data) is None else None

    def iter_state(self, state: State) -> Iterator[tuple[str, dict[str, Any]]]:
        for name in self.names(state):
            data = self.read(state, name)
            if data is not None:
                yield name, data

    def adopt_running(self, name: str) -> Claimed:
        """Take over a running descriptor (recovery); raises QueueError if it cannot be read."""
        path = self.paths.state_dir("running") / name
        data = self.read(State.RUNNING, name)
        if data is None:
            raise QueueError(f"{path}: unreadable running descriptor")
        return Claimed(name=base_name(name), path=path, data=data)


ADDED_MARKER = "added"  # .parallel/added: touched whenever tasks are added to a run


def note_added(paths: RunPaths) -> None:
    """Tell live supervisors that pending/ has new tasks (their next claim rescans it)."""
    marker = paths.parallel / ADDED_MARKER
    now = time.time_ns()
    try:
        os.utime(marker, ns=(now, now))
    except FileNotFoundError:
        marker.touch()
        os.utime(marker, ns=(now, now))


def sync_tree(path: Path) -> None:
    """Flush every file written under ``path`` to disk: syncfs(2) where available, else sync(2)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        syncfs = getattr(libc, "syncfs", None)
        if syncfs is not None:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                if syncfs(fd) == 0:
                    return
            finally:
                os.close(fd)
    os.sync()


__all__ = [
    "STATES",
    "Claimed",
    "DirQueue",
    "State",
    "attempts_used",
    "base_name",
    "descriptor_name",
    "lease_of",
    "new_descriptor",
    "note_added",
    "sync_tree",
    "task_id_of",
]
