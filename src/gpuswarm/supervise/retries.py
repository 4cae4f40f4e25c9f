"""Retries waiting out their backoff (the committer's, :mod:`.committer`): a failed attempt with
attempts left waits in running/, under our lease, on a heap by its due time; the keeper moves
those due back to pending/ (:meth:`DelayedRetries.release_delayed`, all of them on a stop), and
a cancel of one ends it cancelled from there. The loop does not end while one waits."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

from gpuswarm.core.errors import LeaseLostError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import State
from gpuswarm.store.control import Request
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import Claimed
from gpuswarm.supervise.context import Shared
from gpuswarm.supervise.controls import move_cancelled, still_bound

__all__ = ["DelayedRetries", "requeued"]


class DelayedRetries:
    """The retries of ours in their backoff; ``after_end``: a task ended (its dependents)."""

    def __init__(self, run: Shared, after_end: Callable[[str, State], None]) -> None:
        self.run = run
        self._after_end = after_end
        self._delayed: list[tuple[float, int, Claimed]] = []  # retries waiting for their backoff
        self._delay_seq = 0
        self._releasing = 0  # retries taken off the heap, not yet in pending/

    def add(self, at: float, claimed: Claimed) -> None:
        """A retry (saved with its ``retry_at``) waits until ``at``."""
        with self.run.lock:  # the loop does not end while a retry waits
            self._delay_seq += 1
            heapq.heappush(self._delayed, (at, self._delay_seq, claimed))

    def waiting(self) -> bool:
        """Whether a retry waits out its backoff, or is on its way to pending/ (the loop does
        not end meanwhile: it would leave the retry pending)."""
        with self.run.lock:
            return bool(self._delayed) or self._releasing > 0

    def cancel_waiting(self, task_id: str, reqs: list[Request]) -> bool:
        """A retry of ours waiting out its backoff (in running/, under our lease) is cancelled
        now (keeper thread); False when ``task_id`` is no such retry."""
        run = self.run
        with run.lock:
            hit = next((item for item in self._delayed if item[2].task_id == task_id), None)
        if hit is None:
            return False
        # the keeper's thread both releases retries and calls this: the hit stays put meanwhile
        reqs = still_bound(run.queue, run.ledger, reqs, hit[2].desc, run.cfg.owner)
        if not reqs:
            return True  # made for the attempt before this retry: dropped as too late
        with run.lock:
            if hit not in self._delayed:
                return False
            self._delayed.remove(hit)
            heapq.heapify(self._delayed)
            self._releasing += 1  # the loop does not end before it is in cancelled/
        claimed = hit[2]
        try:
            claimed.desc.take_retry_at()
            move_cancelled(run.queue, run.ledger, claimed, reqs, run.cfg.owner, None)
            self._after_end(task_id, State.CANCELLED)
        except LeaseLostError:
            run.lease_lost(task_id, None, "its cancel is left to the reclaimer")
        finally:
            with run.lock:
                self._releasing -= 1
        run.wakeup()
        return True

    def release_delayed(self, *, everything: bool) -> None:
        """Move retries whose backoff is over (or all of them, on stop) back to pending/."""
        run = self.run
        now = time.time()
        while True:
            with run.lock:
                if not self._delayed or (not everything and self._delayed[0][0] > now):
                    return
                _, _, claimed = heapq.heappop(self._delayed)
                self._releasing += 1
            try:
                self._release(claimed)
            finally:
                with run.lock:
                    self._releasing -= 1

    def _release(self, claimed: Claimed) -> None:
        run = self.run
        claimed.desc.take_retry_at()
        try:
            run.queue.move(
                claimed, State.PENDING, requeued(run.ledger, claimed, "retry", "waiting")
            )
        except LeaseLostError:
            run.lease_lost(claimed.task_id, None, "its retry is left to the reclaimer")
            return
        run.more_work()  # before _releasing drops: a loop that sees neither claims again


def requeued(ledger: Ledger, claimed: Claimed, reason: str, frm: str) -> Callable[[], object]:
    """The ``requeued`` event of ``claimed``'s move back to pending/ (journaled by the move)."""
    return lambda: ledger.emit(Ev.REQUEUED, task=claimed.task_id, reason=reason, frm=frm)
