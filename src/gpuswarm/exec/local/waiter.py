"""The waiting side of a local attempt: its state, and the blocking primitives of its waiter.

:class:`AttemptState` holds what an attempt knows about its processes, reads it out as the
Handle's flags (``done`` and ``cancelled`` through exec/base.py's EndFlags, ``exit_fd``,
``deadline``) and sleeps in ``poll()`` on its pidfd (or in slices, without one) and on the
wake-up pipe that ``cancel`` writes to; the launch, the stop and the verdict are
:class:`gpuswarm.exec.local.process.Attempt`'s.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import subprocess
import threading
import time

import psutil

from gpuswarm.core.logs import LogPump, LogSink
from gpuswarm.exec.base import AttemptEnd, EndFlags, LaunchSpec
from gpuswarm.exec.local.tree import REGISTRY, SLICE

_MAX_POLL_MS = 3_600_000  # poll() takes a C int of milliseconds: longer waits are re-armed


class AttemptState(EndFlags):
    """One attempt's processes, fds and flags (see :class:`~.process.Attempt`)."""

    def __init__(self, spec: LaunchSpec, token: str, started: float) -> None:
        self.spec = spec
        self.token = token
        self.started = started
        self.pid: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._end: AttemptEnd | None = None
        self._t0 = time.monotonic()
        self._rc = 0
        self._reaped = True
        self._group_gone = False
        self._cancelled = False
        self._hard = False
        self._main_killed = False
        self._seen: dict[int, psutil.Process] = {}
        self._killed: set[int] = set()
        self._pidfd: int | None = None
        self._pump: LogPump | None = None
        self._sink: LogSink | None = None
        self._wake: tuple[int, int] | None = None
        self._wait_lock = threading.Lock()
        self._pid_lock = threading.Lock()
        self._fd_lock = threading.RLock()  # re-entrant: cancel() may run in a signal handler

    # -- what it reads as (the Handle's flags) -----------------------------------------------------
    @property
    def exit_fd(self) -> int | None:
        """A pidfd that polls readable once the main process exits (None: no pidfd here; then
        only :meth:`wait` can tell)."""
        return self._pidfd

    @property
    def deadline(self) -> float | None:
        """When the timeout expires, on the ``time.monotonic`` clock."""
        return None if self.spec.timeout is None else self._t0 + self.spec.timeout

    # -- waiting -----------------------------------------------------------------------------------
    def _block(self, timeout: float | None, *, main: bool) -> None:
        """Sleep until ``timeout``, a cancel() wake-up, or (``main``) the main process exits."""
        poller = select.poll()
        if main and self._pidfd is not None:
            poller.register(self._pidfd, select.POLLIN)
        elif main and (timeout is None or timeout > SLICE):
            timeout = SLICE  # no pidfd: poll the main process in slices
        if self._wake is not None:
            poller.register(self._wake[0], select.POLLIN)
        ms = None if timeout is None else min(_MAX_POLL_MS, math.ceil(max(timeout, 0) * 1000))
        ready = poller.poll(ms)
        if self._wake is not None and any(fd == self._wake[0] for fd, _ in ready):
            with contextlib.suppress(OSError):
                os.read(self._wake[0], 4096)

    def _nap(self, seconds: float) -> bool:
        """Nap that gives up (True) on a hard cancel."""
        self._block(seconds, main=not self._reaped)
        return self._hard

    def _poll_main(self) -> bool:
        """Whether the main process has exited; reaps it (and unregisters it) when it has."""
        if self._reaped or self._popen is None:
            return True
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            if not poller.poll(0):
                return False
        elif self._popen.poll() is None:
            return False
        with self._pid_lock:
            self._rc = self._popen.wait()
            self._reaped = True
        with REGISTRY.lock:
            if self.pid is not None and REGISTRY.live.get(self.pid) is self:
                del REGISTRY.live[self.pid]
        return True

    def _open_wake(self) -> None:
        """The pipe cancel() writes to, to wake a thread blocked in wait(): made only for a wait
        (the loop's attempts never block). Made before wait() looks at the cancel flags, which
        cancel() sets before it looks for the pipe: one of them sees the other."""
        with self._fd_lock:
            if self._wake is None and self._end is None:
                self._wake = os.pipe()
                for fd in self._wake:
                    os.set_blocking(fd, False)

    def _close(self) -> None:
        with self._fd_lock:
            fds = [*(self._wake or ()), self._pidfd]
            self._wake = self._pidfd = None
        for fd in fds:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
