"""A claimed descriptor's save and its move on (to done, failed, skipped, back to pending),
part of :class:`gpuswarm.store.queue.DirQueue` (this is its mixin): each fenced save ->
journal (the caller's ``announce``) -> rename, alone or in a committer's group commit
(:mod:`.groupcommit`), the folders' fsyncs shared by the slots finishing together.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from gpuswarm.core import faults
from gpuswarm.core.errors import LeaseLostError
from gpuswarm.core.fsutil import DirSyncer, Spares, atomic_write_bytes, dumps_compact
from gpuswarm.core.models import State
from gpuswarm.store.claimed import Claimed
from gpuswarm.store.groupcommit import Grouped, commit_group
from gpuswarm.store.queuebase import QueueBase


class QueueMoves(QueueBase):
    """DirQueue's transitions of a claimed descriptor (see the module's doc)."""

    # DirQueue's, made once in its __init__
    _state_paths: dict[str, Path]  # each state folder
    _dir_sync: DirSyncer  # slots finishing together share the folder fsync
    _local: threading.local  # .dirs: folders whose fsync a batch defers; .group; .spares

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
            tmp = self._spares().write(claimed.path, data)  # a kept inode, else a new one
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
            commit_group(group, self._moved, self._spares())

    def _spares(self) -> Spares:
        """This thread's swapped-out files, to be written again (:class:`~.fsutil.Spares`)."""
        spares: Spares | None = getattr(self._local, "spares", None)
        if spares is None:
            spares = self._local.spares = Spares()
        return spares

    def drop_spares(self) -> None:
        """Remove the files this thread's group commits kept (its last batch is made)."""
        spares: Spares | None = getattr(self._local, "spares", None)
        if spares is not None:
            spares.drop()

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
