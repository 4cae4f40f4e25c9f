"""One attempt of a task as a subprocess (the local backend's Handle); nothing of it is left.

Each attempt runs in its own session with a unique ``GPUSWARM_ATTEMPT_TOKEN`` in its environment.
While it runs, the supervisor's loop polls its pidfd (``exit_fd``, then ``end_if_clean``), or a
thread sleeps in ``poll()`` on the pidfd and a wake-up pipe (``wait``): no polling loop.
When it ends, for any reason, its process group gets SIGTERM, a grace period, then SIGKILL. Escapees
are claimed through :mod:`gpuswarm.exec.local.tree` (token, process group/session, an earlier
snapshot of the tree); a process without a token is claimed only when no other attempt is live
or launching.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

import psutil

from gpuswarm.core.logs import LogPump
from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd, LaunchSpec
from gpuswarm.exec.local.programs import popen
from gpuswarm.exec.local.spawn import (
    LOG_FLAGS,
    PUMPED_LOG_FLAGS,
    fresh_log_dir,
    make_log_dir,
    precheck,
    spawn_failure,
    verdict,
)
from gpuswarm.exec.local.tree import (
    REGISTRY,
    SETTLE,
    TOKEN_VAR,
    Stat,
    candidates,
    descendants,
    none_alive,
    processes,
    shared_descendants,
    signal_alive,
    token_of,
    wait_until,
)
from gpuswarm.exec.local.waiter import AttemptState

# find_by_env, kill_tree: research (its runner and proposers, through gpuswarm.app.api) ends its
# own processes with them
__all__ = ["Attempt"]

_ROUNDS = 10  # bounded passes over leftovers (a killed parent re-parents its children to us)
_USE_PIDFD = hasattr(os, "pidfd_open")


class Attempt(AttemptState):
    """One launched attempt. :meth:`wait` from one thread; :meth:`cancel` from any."""

    @classmethod
    def launch(
        cls, spec: LaunchSpec, *, pump: LogPump | None = None, max_log_bytes: int = 0
    ) -> Attempt:
        """Start ``spec``; a command that cannot start gives an attempt that has already ended.

        With ``pump``, the task writes into a pipe that the pump drains into its log, holding
        ``max_log_bytes`` while the task writes; without, straight into the log (O_APPEND)."""
        attempt = cls(spec, spec.token or uuid.uuid4().hex, time.time())
        if pump is not None:
            return attempt._launch_pumped(pump, max_log_bytes)
        try:
            make_log_dir(spec.log_path.parent)
            log = os.open(spec.log_path, LOG_FLAGS, 0o600)  # private; the child gets a copy
        except OSError as exc:
            return attempt._failed(EndKind.SPAWN_ERROR, f"cannot open log {spec.log_path}: {exc}")
        try:
            pre = precheck(spec)
            failure = (EndKind.SPAWN_ERROR, pre) if pre else attempt._spawn(log)
            if failure is not None:
                with contextlib.suppress(OSError):
                    os.write(log, f"gpuswarm: {failure[1]}\n".encode())
                return attempt._failed(*failure)
        finally:
            os.close(log)
        return attempt

    def _launch_pumped(self, pump: LogPump, limit: int) -> Attempt:
        spec = self.spec
        try:
            fresh_log_dir(spec.log_path.parent)
            log = os.open(spec.log_path, PUMPED_LOG_FLAGS, 0o600)  # private, like the unpumped log
        except OSError as exc:
            return self._failed(EndKind.SPAWN_ERROR, f"cannot open log {spec.log_path}: {exc}")
        try:
            sink = pump.add(log, limit or (256 << 20))  # the pump owns the log from now on
        except OSError as exc:
            os.close(log)
            return self._failed(EndKind.SPAWN_ERROR, f"cannot open a pipe for the log: {exc}")
        self._pump, self._sink = pump, sink
        pre = precheck(spec)
        # the child keeps a copy of the read end too: if this supervisor dies (SIGKILL), the
        # task's next write must not end it with EPIPE/SIGPIPE (an attempt that finishes before
        # the resume is judged done); the pipe's buffer (1 MiB where allowed) takes what it
        # prints meanwhile, and only a task that fills it waits there
        keep = (sink.read_fd,)
        failure = (EndKind.SPAWN_ERROR, pre) if pre else self._spawn(sink.write_fd, keep)
        if failure is not None:
            with contextlib.suppress(OSError):
                os.write(sink.write_fd, f"gpuswarm: {failure[1]}\n".encode())
        # the sink keeps the write end until finish(): the task's exit wakes no pump thread
        if failure is not None:
            self._finish_log()
            return self._failed(*failure)
        return self

    def _finish_log(self) -> None:
        """Everything the attempt wrote is in its log (before the log is read)."""
        pump, sink, self._pump, self._sink = self._pump, self._sink, None, None
        if pump is not None and sink is not None:
            pump.finish(sink)

    def _spawn(self, log: int, keep: tuple[int, ...] = ()) -> tuple[EndKind, str] | None:
        env = {**self.spec.env, TOKEN_VAR: self.token}
        with REGISTRY.lock:
            REGISTRY.launching += 1
        try:
            self._popen = popen(self.spec.argv, env, self.spec.cwd, log, keep)
        except (OSError, ValueError, TypeError) as exc:
            self._close()
            return spawn_failure(exc, self.spec)
        finally:
            with REGISTRY.lock:  # registered before `launching` drops: never mistaken for a stray
                REGISTRY.launching -= 1
                if self._popen is not None:
                    self.pid, self._reaped = self._popen.pid, False
                    REGISTRY.live[self.pid] = self
        if _USE_PIDFD and self.pid is not None:
            with contextlib.suppress(OSError):  # no pidfd: _block() polls in slices
                self._pidfd = os.pidfd_open(self.pid)
        return None

    def _failed(self, kind: EndKind, reason: str) -> Attempt:
        now = time.time()
        self._end = AttemptEnd(kind, None, None, reason, False, self.started, now, None, 0)
        return self

    def cancel(self, *, hard: bool = False) -> None:
        """Stop the attempt: soft = SIGTERM, grace, SIGKILL; hard = SIGKILL now. Thread-safe."""
        if self._end is not None:
            return
        self._cancelled = True
        if hard:
            self._hard = True
            if self._pid_lock.acquire(blocking=False):  # never block (signal handler)
                try:
                    if not self._reaped and self.pid is not None:
                        with contextlib.suppress(OSError):
                            os.killpg(self.pid, signal.SIGKILL)
                finally:
                    self._pid_lock.release()
        with self._fd_lock:
            if self._wake is not None:
                with contextlib.suppress(OSError):
                    os.write(self._wake[1], b"x")

    def pids(self) -> list[int]:
        """The main process and every process below it, with escapees an earlier snapshot of
        the tree saw (a double fork re-parents them to us); [] once it ended. Any thread."""
        if self._end is not None or self.pid is None:
            return []
        roots = [] if self._reaped else [self.pid]
        for pid, proc in list(self._seen.items()):
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    roots.append(pid)
        return sorted(shared_descendants(roots)) if roots else []

    def end_if_clean(self) -> AttemptEnd | None:
        """The end of an attempt whose main process exited with nothing of it left, without
        blocking; None while it runs, once it was cancelled, or when something of it is left
        (a group member, an escapee): then :meth:`wait` (in any thread) finishes the job."""
        if self._end is not None:
            return self._end
        if self._cancelled or not self._wait_lock.acquire(blocking=False):
            return None
        try:
            if not self._poll_main() or self._cancelled or self._claimed() or self._group_alive():
                return None
            self._end = self._classify("exited")
        finally:
            self._wait_lock.release()
        self._close()
        return self._end

    def wait(self) -> AttemptEnd:
        """Block until the attempt ends; on return nothing of it is alive."""
        with self._wait_lock:
            if self._end is None:
                self._open_wake()
                try:
                    self._end = self._supervise()
                except BaseException:
                    self.cancel(hard=True)  # interrupted: do not leave it running unsupervised
                    raise
                self._close()
            return self._end

    def _supervise(self) -> AttemptEnd:
        how = self._wait_main()
        if how != "exited":
            self._terminate(graceful=not self._hard)
            while not self._poll_main():
                self._block(None, main=True)
        self._clean_leftovers(graceful=how == "exited")
        return self._classify(how)

    def _wait_main(self) -> str:
        deadline = None if self.spec.timeout is None else self._t0 + self.spec.timeout
        while True:
            if self._poll_main():
                return "cancelled" if self._hard else "exited"  # hard: our SIGKILL may be why
            if self._cancelled:
                return "cancelled"
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return "timeout"
            self._block(left, main=True)

    # -- leftovers ---------------------------------------------------------------------------------
    def _owns(self, pid: int, st: Stat, live: frozenset[int]) -> bool:
        """Ours by an earlier tree snapshot, or by our process group or session."""
        seen = self._seen.get(pid)
        if seen is not None:
            with contextlib.suppress(psutil.Error):
                if seen.is_running():
                    return True
        if self.pid is None or self.pid in live:  # our pid number now belongs to another attempt
            return False
        return (st.pgid == self.pid and not self._group_gone) or st.sid == self.pid

    def _claimed(self) -> list[int]:
        """Our live children (re-parented escapees) that belong to this attempt."""
        scan = candidates(self)
        out = []
        for pid, st in scan.alive:
            if self._owns(pid, st, scan.live):
                out.append(pid)
                continue
            token = token_of(pid)
            if token == self.token or (token is None and scan.lonely):
                out.append(pid)
        return out

    def _group_alive(self) -> bool:
        """Whether anything is left in our process group (checked only once the main is reaped)."""
        if self._group_gone or self.pid is None:
            return False
        if not self._reaped:
            return True
        for first in (True, False):
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                self._group_gone = True  # an empty group never comes back
                return False
            except PermissionError:
                return True
            if first:
                candidates(self)  # reap our zombies of the group, then look again
        return True

    def _snapshot(self) -> dict[int, psutil.Process]:
        roots = self._claimed()
        if not self._reaped and self.pid is not None:
            roots.append(self.pid)
        procs = processes(descendants(roots) - {self.pid}) if roots else {}
        self._seen.update(procs)
        return procs

    def _signal(self, procs: dict[int, psutil.Process], sig: int) -> None:
        self._killed |= signal_alive(procs, sig)  # first, so that the count sees them alive
        if self.pid is not None and self._group_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def _all_gone(self, procs: dict[int, psutil.Process]) -> bool:
        if not self._poll_main() or self._group_alive():
            return False
        return none_alive(procs)

    def _terminate(self, *, graceful: bool) -> None:
        """SIGTERM the group and the tree, wait out the grace, then SIGKILL what is left."""
        procs = self._snapshot()
        if graceful and self.spec.grace > 0 and not self._hard:
            self._signal(procs, signal.SIGTERM)
            deadline = time.monotonic() + self.spec.grace
            if wait_until(lambda: self._all_gone(procs), deadline, self._nap):
                return
            procs.update(self._snapshot())
        self._main_killed = self._main_killed or not self._poll_main()
        self._signal(procs, signal.SIGKILL)
        wait_until(
            lambda: self._all_gone(procs),
            time.monotonic() + SETTLE,
            lambda s: self._nap(s) and False,
        )

    def _clean_leftovers(self, *, graceful: bool) -> None:
        for round_ in range(_ROUNDS):
            if not self._claimed() and not self._group_alive():
                return
            self._terminate(graceful=graceful and round_ == 0)

    # -- the verdict -------------------------------------------------------------------------------
    def _stop_detail(self) -> str:
        if self._hard or self.spec.grace <= 0:
            return "SIGKILL sent"
        return "SIGTERM ignored, SIGKILL sent" if self._main_killed else "stopped by SIGTERM"

    def _classify(self, how: str) -> AttemptEnd:
        self._finish_log()
        return verdict(
            self.spec,
            how,
            self._rc,
            reaped=self._reaped,
            stop=self._stop_detail(),
            started=self.started,
            pid=self.pid,
            killed=len(self._killed),
        )
