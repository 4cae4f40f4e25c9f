"""Group commit: several outcomes' moves made durable by one flush, each then made in order.

A committer's batch (``DirQueue.grouped_commit``) saves each move's descriptor into its temp file
beside the lease, without an fsync; at the block's end :func:`commit_group` makes them all
durable at once (``fsutil.sync_files``: one ``syncfs`` for several, an fsync for one), then, one
move after the other and exactly as a single move does it: the fenced exchange puts the saved
descriptor in place of the lease (a lease a reclaimer took: ``lost``, nothing of it written or
journaled), the journal line, the rename into the state folder. A crash before the flush leaves
only temp files (recovery removes them: the tasks are still running, re-run after a resume); a
crash after it leaves what a crash of single moves leaves. No line of a move is journaled before
its descriptor is durable and in place. (``syncfs`` writes back everything dirty on that
filesystem, tasks' checkpoints too: the committer waits for that, the slot loop does not.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core import faults
from gpuswarm.core.fsutil import Spares, replace_existing, sync_files
from gpuswarm.core.models import State
from gpuswarm.store.claimed import Claimed


@dataclass
class Grouped:
    """One move of a group commit, waiting for the group's flush."""

    claimed: Claimed
    state: State
    tmp: Path  # the saved descriptor: neither durable nor in place yet
    announce: Callable[[], object] | None
    after: Callable[[], object]
    lost: Callable[[], object]


Moved = Callable[["Claimed", State, "Callable[[], object] | None"], object]


def commit_group(group: list[Grouped], moved: Moved, spares: Spares | None = None) -> None:
    """Flush the group's saved descriptors, then put each in place and ``moved`` it (journal,
    rename); each move's ``after`` runs once it is made. ``spares`` keeps the swapped-out
    files to be written again (no inode freed per move: see :class:`~.fsutil.Spares`)."""
    if not group:
        return
    sync_files([item.tmp for item in group])
    faults.point("queue.group.synced", count=len(group))
    for item in group:
        try:
            replace_existing(item.tmp, item.claimed.path, spares)
        except FileNotFoundError:  # the lease is gone: nothing of it written or journaled
            item.lost()
            continue
        moved(item.claimed, item.state, item.announce)
        item.after()
