"""What :class:`gpuswarm.store.queue.DirQueue`'s mixins share (:mod:`.moves`, :mod:`.holds`,
:mod:`.retries`, :mod:`.batches`): the folders read (:class:`.folders.QueueFolders`), the
queue's own members they call, and the ``added`` marker every change to pending/ touches.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from gpuswarm.core.models import Descriptor
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.folders import QueueFolders

Announce = Callable[[Descriptor], object]  # journals a transition between its save and rename


class QueueBase(QueueFolders):
    """The members DirQueue's mixins call; DirQueue gives them."""

    durable: bool  # DirQueue's: fsync what it writes

    def push(self, name: str) -> None:
        """DirQueue's: a name now in pending/ that this queue may claim."""
        raise NotImplementedError

    def quarantine(self, path: Path, reason: str) -> Path:
        """DirQueue's: an unreadable descriptor moved out of the state folders."""
        raise NotImplementedError

    def note_new_work(self) -> None:
        """Live supervisors look at pending/ again (:func:`note_added`)."""
        note_added(self.paths)


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
