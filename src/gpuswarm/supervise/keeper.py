"""The keeper: the supervisor's periodic duties, in one thread beside the loop.

Each tick it caps logs (when the backend does not), releases retries whose backoff is over,
fences attempts whose lease a reclaimer took, applies control requests and pause flags
(:mod:`.controls`), and wakes the loop for quarantines whose cool-down may be over; less often
it syncs the journal and reclaims the tasks of dead supervisors (in a thread of its own:
killing a dead owner's stubborn leftovers takes a grace period). The heartbeat (the owner
file's mtime) is :mod:`.heartbeat`'s own thread, so no duty here can delay it.

Between ticks it looks at the run's ``added`` marker every :data:`WAKE_LOOK` seconds (one
``stat``): ``gpuswarm add``, ``retry``, ``unpause`` and ``priority`` touch it, from any process
on any host that shares the run folder, and a change wakes the loop to claim again (and applies
control requests at once: ``api.cancel``, a research loop's prune, touches it too). The loop
itself sleeps in ``poll()`` on its attempts' fds while they run, so without this a slot that
went idle beside a long task would wait for that task's end to see new work.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuswarm.core.logs import cap_log
from gpuswarm.exec.base import Backend
from gpuswarm.supervise.committer import Committer
from gpuswarm.supervise.context import Shared
from gpuswarm.supervise.controls import Controller
from gpuswarm.supervise.recovery import reclaim_dead
from gpuswarm.supervise.spendwatch import SpendWatch
from gpuswarm.supervise.stall import StallWatch

FAST_TICK = 0.02  # the keeper's tick while some log grows past its cap
WAKE_LOOK = 0.25  # the ``added`` marker is looked at this often (a stat: new work to claim)


class Keeper:
    def __init__(
        self, run: Shared, backend: Backend, committer: Committer, cooling: Callable[[], bool]
    ) -> None:
        self.run = run
        self.backend = backend
        self.committer = committer
        self.cooling = cooling  # whether some slot is quarantined (its cool-down may be over)
        self.control = Controller(run, committer.retries.cancel_waiting)
        self.done = threading.Event()
        self._log_sizes: dict[Path, int] = {}
        self._reclaimer: threading.Thread | None = None
        self._mark = self._added_mark()  # the marker as the loop's first claim will see it
        self.stalls = StallWatch(run)  # issue 34: stall_after
        self.spends = SpendWatch(run)  # issue 34: max_usd while a streaming CLI runs

    def serve(self) -> None:
        """The keeper, started again after an error (a full disk: a retry that cannot be
        requeued, a journal that cannot be synced): the run stops, keeping goes on."""
        while True:
            try:
                self._keep()
                return
            except Exception as exc:
                if not self.run.stopping.is_set():
                    self.run.fail(exc)
                if self.done.wait(1.0):
                    return

    def stop(self, thread: threading.Thread) -> None:
        """End the keeper (its thread) and wait for a reclaim in flight."""
        self.done.set()
        thread.join()
        if self._reclaimer is not None:
            self._reclaimer.join()

    def _keep(self) -> None:
        """Cap logs, release due retries; heartbeat and reclaim less often.

        It ticks once a second, faster (down to 20 ms) while a log grows fast, so a flooding task
        overshoots its cap by little; the journal is synced at the heartbeat's pace (the beat
        itself is heartbeat.py's thread).
        """
        run = self.run
        beat_every = min(run.cfg.heartbeat, run.cfg.lease_ttl / 4)
        next_sync = next_reclaim = 0.0
        tick = min(1.0, beat_every)
        while not self._rest(tick):
            now = time.monotonic()
            tick = min(1.0, beat_every) if self._cap_logs() else FAST_TICK
            self.committer.retries.release_delayed(everything=run.stopping.is_set())
            self._check_leases()
            self.stalls.tick()
            self.spends.tick()
            self.control.tick()
            if self.cooling():  # a cool-down may be over, or a quarantine lifted by hand
                run.wakeup()
            if now >= next_sync:  # a journal that cannot be synced (a full disk) stops the run
                next_sync = now + beat_every
                run.ledger.sync()
            if now >= next_reclaim and not run.stopping.is_set():
                next_reclaim = now + run.cfg.lease_ttl / 3
                if self._reclaimer is None or not self._reclaimer.is_alive():
                    self._reclaimer = threading.Thread(target=self._reclaim, daemon=True)
                    self._reclaimer.start()

    def _rest(self, tick: float) -> bool:
        """Wait out one tick, looking for new work every WAKE_LOOK seconds; True: stop."""
        end = time.monotonic() + tick
        while True:
            left = end - time.monotonic()
            if self.done.wait(max(0.0, min(left, WAKE_LOOK))):
                return True
            self._look_for_work()
            if left <= WAKE_LOOK:
                return False

    def _added_mark(self) -> int | None:
        try:
            return self.run.paths.added_marker.stat().st_mtime_ns
        except FileNotFoundError:
            return None

    def _look_for_work(self) -> None:
        """Tasks were added, retried, reprioritized or unpaused (the marker changed): the
        pause flags are read again and the loop claims for its free slots."""
        mark = self._added_mark()
        if mark == self._mark:
            return
        self._mark = mark
        self.control.tick()  # pause flags again, and a cancel just requested (issue 38)
        self.run.more_work()

    def _check_leases(self) -> None:
        """Kill every attempt whose lease file is gone (a reclaimer renamed it away while this
        supervisor was stalled): one stat per running attempt, no folder scan. Its outcome is
        never committed (the fenced writes would refuse it anyway)."""
        run = self.run
        for live in list(run.live.values()):
            if live.fenced or os.path.lexists(live.claimed.path):
                continue
            if run.live.get(live.slot.index) is not live:
                continue  # it ended meanwhile: its commit is fenced
            live.fenced = True
            run.lease_lost(live.task_id, live.attempt, "its attempt is killed")
            live.handle.cancel(hard=True)

    def _cap_logs(self) -> bool:
        """Cap every live attempt's log; False when one is growing fast (check again soon).

        A backend that holds each log's cap itself (the local log pump) needs none of this."""
        if self.backend.caps_logs:
            return True
        run = self.run
        calm = True
        sizes: dict[Path, int] = {}
        for live in list(run.live.values()):
            path = run.paths.attempt_log(live.task_id, live.attempt)
            if cap_log(path, run.cfg.max_log_bytes):
                calm = False
            with contextlib.suppress(FileNotFoundError):
                sizes[path] = path.stat().st_size
                if sizes[path] - self._log_sizes.get(path, 0) > run.cfg.max_log_bytes // 8:
                    calm = False
        self._log_sizes = sizes
        return calm

    def _reclaim(self) -> None:
        run = self.run
        owner = run.cfg.owner
        lease_ttl = run.cfg.lease_ttl
        if reclaim_dead(run.queue, run.ledger, owner, lease_ttl=lease_ttl, backend=self.backend):
            run.more_work()
