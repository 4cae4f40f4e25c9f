"""The heartbeat: the owner file's mtime, renewed on a thread of its own.

Other supervisors (on any host) take a supervisor whose owner file is older than ``lease_ttl``
for dead and reclaim its tasks. So the beat must not wait on any other duty: a reclaim that
waits for a dead supervisor's log keeper, a slow control tick, or a shutdown that waits for the
backend to close. It runs from before the first claim until just before the owner file is
removed, at least four times per ``lease_ttl``, and syncs the journal first (what the beat
vouches for is on disk).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING

from gpuswarm.store.leases import owner_file

if TYPE_CHECKING:
    from gpuswarm.supervise.context import Shared


class Heartbeat:
    def __init__(self, run: Shared) -> None:
        self.run = run
        self.every = min(run.cfg.heartbeat, run.cfg.lease_ttl / 4)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self) -> None:
        run = self.run
        with contextlib.suppress(OSError):  # a full disk: the keeper's next sync says so
            run.ledger.sync()
        with contextlib.suppress(FileNotFoundError):
            os.utime(owner_file(run.paths, run.cfg.owner))

    def _serve(self) -> None:
        self.beat()
        while not self._done.wait(self.every):
            self.beat()
