"""Whether an idle supervisor waits or ends (see :mod:`.supervisor`): nothing of ours runs and
nothing is claimable now, but a retry may be due, other supervisors may hand tasks back, tasks
may be enqueued, a pause lifted, GPU memory freed or a cluster's node join."""

from __future__ import annotations

import time

from gpuswarm.core.models import State
from gpuswarm.store.names import lease_of
from gpuswarm.supervise.committer import Committer
from gpuswarm.supervise.context import Shared
from gpuswarm.supervise.membership import SlotSync
from gpuswarm.supervise.packing import GpuPlacement

IDLE_POLL_SECONDS = 2.0  # an idle supervisor re-checks a queue other supervisors still work on
LINGER_POLL_SECONDS = 0.1  # a lingering idle supervisor looks for new tasks this often

__all__ = ["LINGER_POLL_SECONDS", "IdleRule"]


class IdleRule:
    """What an idle supervisor waits for, if anything."""

    def __init__(
        self, run: Shared, committer: Committer, gpus: GpuPlacement, slot_sync: SlotSync
    ) -> None:
        self.run = run
        self.committer = committer
        self.gpus = gpus
        self.slot_sync = slot_sync

    def wait(self, busy_at: float) -> tuple[bool, float | None]:
        """Nothing of ours runs and nothing is claimable: wait (and how long between looks at
        pending/; None = until woken) or end? ``busy_at``: the last claim or release."""
        queue = self.run.queue
        if self.committer.retries.waiting():
            return True, None  # the keeper wakes us when a retry's backoff is over
        if self._others_running():
            return True, IDLE_POLL_SECONDS  # their retries land in pending/, or they die
        if time.monotonic() - busy_at < self.run.cfg.linger:
            return True, LINGER_POLL_SECONDS  # new tasks may be enqueued
        if queue.paths.enqueue_spool.exists():  # a streamed enqueue: more are coming
            return True, LINGER_POLL_SECONDS
        if self._paused_with_work():  # the keeper wakes us when the pause changes; the
            return True, IDLE_POLL_SECONDS  # look: other supervisors may empty pending/
        if self.gpus.waiting():  # tasks wait for GPU memory (the sampler wakes us on room)
            return True, IDLE_POLL_SECONDS
        if self.slot_sync.checking and queue.counts()[State.PENDING] > 0:
            return True, IDLE_POLL_SECONDS  # joined slots run their preflight (then wake us)
        if self.slot_sync.waiting_for_slots():  # a cluster's nodes all gone: one may join
            return True, IDLE_POLL_SECONDS
        return False, None

    def _paused_with_work(self) -> bool:
        """Some of our slots are paused and pending/ still holds tasks (they would claim)."""
        if not any(self.run.holds(s) for s in self.run.cfg.slots):
            return False
        return self.run.queue.counts()[State.PENDING] > 0

    def _others_running(self) -> bool:
        """Whether other supervisors hold tasks (they may requeue them, or die and be reclaimed)."""
        return any(
            (lease := lease_of(name)) is not None and lease[0] != self.run.cfg.owner
            for name in self.run.queue.names(State.RUNNING)
        )
