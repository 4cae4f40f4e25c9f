"""The attempts the slot loop waits on: their wake-up fds (a pidfd, for the local backend) and
a wake-up pipe in one ``poll()``, and the waiter threads that run an attempt's blocking end
(TERM, grace, KILL, leftovers) and hand its slot back (see :mod:`.supervisor`).

An attempt whose process exited with nothing of it left is settled in the loop thread; one that
needs time (its timeout expired, a stop or a cancel, something of it outlived its main process,
no wake-up fd) goes to a waiter. Either way its slot comes back through :meth:`Watch.take`.
"""

from __future__ import annotations

import contextlib
import os
import queue as threadq
import select
import threading
import time
from collections.abc import Callable

from gpuswarm.exec.base import AttemptEnd
from gpuswarm.placement.gpus import Slot
from gpuswarm.supervise.context import LiveAttempt
from gpuswarm.supervise.outside_stop import ended, from_outside

MAX_SLEEP_MS = 3_600_000  # poll() takes a C int of milliseconds (24.8 days): re-armed after

# (slot, end, error, slow: from a waiter, task id, neutral: an end the breaker ignores)
Returned = tuple[Slot, AttemptEnd | None, BaseException | None, bool, str, bool]

# the attempt has ended: its slot is free, its outcome on its way (slow: in a waiter thread)
Settle = Callable[[LiveAttempt, AttemptEnd, bool], Returned]

__all__ = ["Returned", "Settle", "Watch"]


class Watch:
    """The loop's poll set and waiter threads; ``settle`` ends an attempt (its outcome)."""

    def __init__(self, settle: Settle, stopping: threading.Event) -> None:
        self._settle = settle
        self._stopping = stopping
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._returns: threadq.SimpleQueue[Returned] = threadq.SimpleQueue()
        self._waiters: list[threading.Thread] = []
        self._by_fd: dict[int, LiveAttempt] = {}  # attempts the loop itself watches
        self._slow = 0  # attempts in waiter threads
        self._poller = select.poll()

    # -- the wake-up pipe ----------------------------------------------------------------------
    def listen(self) -> None:
        """The loop begins: its sleeps wake for the pipe."""
        self._poller.register(self._wake_r, select.POLLIN)

    def wakeup(self) -> None:
        """Make the loop look again (safe from signal handlers and any thread)."""
        if self._wake_w < 0:  # the run is over
            return
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def close(self) -> None:
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:  # a stop request from now on must not write into a reused fd number
            os.close(fd)

    # -- attempts ------------------------------------------------------------------------------
    def busy(self) -> bool:
        """Whether an attempt is watched here or ends in a waiter thread."""
        return bool(self._by_fd) or self._slow > 0

    def watch(self, live: LiveAttempt, fd: int) -> None:
        """Poll ``live``'s wake-up fd ``fd``."""
        live.fd = fd
        self._by_fd[fd] = live
        self._poller.register(fd, select.POLLIN)

    def returned(self, back: Returned) -> None:
        """A slot whose attempt ended at once (it could not start)."""
        self._returns.put(back)

    def take(self) -> Returned | None:
        """The next slot whose attempt has an outcome (None: none now)."""
        try:
            back = self._returns.get_nowait()
        except threadq.Empty:
            return None
        self._slow -= back[3]
        return back

    def timeout(self, poll: float | None) -> float | None:
        """The poll interval, or sooner when a running attempt's timeout expires."""
        now = time.monotonic()
        deadlines = [d for live in self._by_fd.values() if (d := live.handle.deadline) is not None]
        if deadlines:
            left = max(0.0, min(deadlines) - now)
            return left if poll is None else min(left, poll)
        return poll

    def sleep(self, timeout: float | None) -> bool:
        """Wait for an exit, a wake-up or ``timeout``; handle what happened. True on timeout."""
        ms = None if timeout is None else min(MAX_SLEEP_MS, max(0, int(timeout * 1000 + 0.999)))
        ready = self._poller.poll(ms)
        for fd, _ in ready:
            if fd == self._wake_r:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
            elif fd in self._by_fd:
                self._exited(self._by_fd[fd])
        now = time.monotonic()
        for live in list(self._by_fd.values()):
            if live.ending:  # a cancel, a stall, max_usd crossed (issue 34)
                self.to_waiter(live)  # a person cancelled it: TERM, grace, KILL take time
                continue
            deadline = live.handle.deadline
            if deadline is not None and deadline <= now:
                self.to_waiter(live)  # its timeout: TERM, grace, KILL take time
        return not ready

    def _exited(self, live: LiveAttempt) -> None:
        self._unwatch(live)
        if (end := live.handle.end_if_clean()) is None or from_outside(live, end):
            self.to_waiter(live)  # something of it is left, a stop cancelled it, or a stop
            return  # signal from outside killed it: its supervisor's may follow (.outside_stop)
        self._returns.put(self._settle(live, end, False))

    def _unwatch(self, live: LiveAttempt) -> None:
        """Stop polling the attempt's pidfd (before it is closed: the number may be reused)."""
        fd, live.fd = live.fd, None
        if fd is not None:
            del self._by_fd[fd]
            self._poller.unregister(fd)

    # -- waiter threads ------------------------------------------------------------------------
    def to_waiter(self, live: LiveAttempt) -> None:
        """Let a thread run the blocking end of this attempt (stop, grace, leftovers)."""
        self._unwatch(live)
        self._slow += 1
        waiter = threading.Thread(target=self._wait_slow, args=(live,), daemon=True)
        self._waiters = [w for w in self._waiters if w.is_alive()]
        self._waiters.append(waiter)
        waiter.start()

    def _wait_slow(self, live: LiveAttempt) -> None:
        try:
            self._returns.put(self._settle(live, ended(live, self._stopping), True))
        except BaseException as exc:
            self._returns.put((live.slot, None, exc, True, live.task_id, False))
        self.wakeup()

    def hand_all_to_waiters(self, *, cold: bool) -> None:
        """A stop: every watched attempt cancelled (``cold``: SIGKILL) and ended by a waiter."""
        for live in list(self._by_fd.values()):
            live.handle.cancel(hard=cold)
            self.to_waiter(live)

    def drain(self, *, cold: bool) -> None:
        """After a loop error: stop what runs and wait for it (nothing runs unsupervised)."""
        self.hand_all_to_waiters(cold=cold)
        for waiter in self._waiters:
            waiter.join()
