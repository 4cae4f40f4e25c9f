"""One attempt in a container: the Handle of the docker backend.

The attached ``docker run`` client is a local attempt (:class:`~gpuswarm.exec.local.process.
Attempt`: its own session, its output pumped into the log under the cap); the container is what
runs the task. So the end of the *client* is never taken for the end of the task: once the
client exits, ``docker inspect`` says whether the container ended and how (its exit code,
``OOMKilled``, docker's own start error); a client killed while the container runs on leaves
the attempt running, and it is waited for through inspect.

A timeout or a stop sends SIGTERM to every process of the container (their host pids, found by
the container's pid namespace; ``docker kill --signal TERM`` to its init where the daemon is on
another host), waits out the grace, then ``docker kill`` (SIGKILL to its init: the kernel ends
every process of the namespace, a ``setsid`` escapee and a TERM-ignoring tree included). The
container is removed once its end is read (by the backend's remover thread: the slot does not
wait for ``docker rm``; the container has ended, its GPU is free). ``wait`` runs in the
supervisor's waiter thread;
``cancel`` only sets flags and writes to a pipe (safe in a signal handler).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuswarm.core.errors import BackendError
from gpuswarm.core.logs import log_tail
from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd, EndFlags, LaunchSpec
from gpuswarm.exec.docker.client import ContainerState, DockerCLI, host_pids, signal_container
from gpuswarm.exec.local.process import Attempt
from gpuswarm.exec.local.spawn import verdict

if TYPE_CHECKING:
    from gpuswarm.core.logs import LogPump

_SLICE = 0.2  # seconds between looks where there is no fd to sleep on
_SETTLE = 15.0  # seconds the client may take to exit once its container was killed
_MAX_POLL_MS = 3_600_000
_TINI = "[FATAL tini"  # docker-init's own line: the task's program could not be started
_SIGNALS = {int(s) for s in signal.Signals}
_RETRIES = (0.5, 1.0, 2.0, None)  # seconds between inspect tries when the daemon stalls


class ContainerAttempt(EndFlags):
    """One launched attempt in container ``name``. ``wait`` from one thread at a time."""

    def __init__(
        self,
        spec: LaunchSpec,
        name: str,
        cli: DockerCLI,
        client: Attempt,
        remove: Callable[[str], None] | None = None,
    ) -> None:
        self.spec = spec
        self.name = name
        self._cli = cli
        self._remove = remove or (lambda name: cli.remove([name]))
        self._client = client
        self._t0 = time.monotonic()
        self._end: AttemptEnd | None = None
        self._cancelled = False
        self._hard = False
        self._main_killed = False
        self._notes: list[str] = []
        self._init_pid: int | None = None  # the container's init on the host (pids())
        self._wait_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        if client.done:  # the client itself could not start: that is the attempt's end
            self._end = client.wait()
            self._close()

    @classmethod
    def launch(
        cls,
        spec: LaunchSpec,
        client_spec: LaunchSpec,
        name: str,
        cli: DockerCLI,
        pump: LogPump | None,
        max_log_bytes: int,
        remove: Callable[[str], None] | None = None,
    ) -> ContainerAttempt:
        client = Attempt.launch(client_spec, pump=pump, max_log_bytes=max_log_bytes)
        return cls(spec, name, cli, client, remove)

    # -- the Handle ------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._client.pid  # the docker client's (the container's own pids are its own)

    @property
    def exit_fd(self) -> None:
        return None  # ending needs docker calls: always the waiter thread's blocking wait

    @property
    def deadline(self) -> float | None:
        return None if self.spec.timeout is None else self._t0 + self.spec.timeout

    def end_if_clean(self) -> AttemptEnd | None:
        return self._end

    def pids(self) -> list[int]:
        """The host pids of the container's processes (its pid namespace, init included); the
        init's pid is asked of docker once. [] before it runs, once it ended, or where its
        namespace is out of sight (a daemon on another host)."""
        if self._end is not None:
            return []
        if self._init_pid is None:
            try:
                state = self._cli.inspect(self.name)
            except BackendError:
                return []
            if state is None or not state.running or state.pid <= 0:
                return []
            self._init_pid = state.pid
        return host_pids(self._init_pid)

    def cancel(self, *, hard: bool = False) -> None:
        """Soft: TERM, grace, KILL (done by :meth:`wait`); hard: KILL now. Never blocks."""
        if self._end is not None:
            return
        self._cancelled = True
        self._hard = self._hard or hard
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def wait(self) -> AttemptEnd:
        with self._wait_lock:
            if self._end is None:
                try:
                    self._end = self._supervise()
                except BaseException:
                    self._kill_now()  # interrupted: do not leave it running unsupervised
                    raise
                finally:
                    self._close()
            return self._end

    # -- the blocking path -----------------------------------------------------------------------
    def _supervise(self) -> AttemptEnd:
        how = self._wait_client()
        if how != "exited":
            self._stop(graceful=not self._hard and self.spec.grace > 0)
        self._client_settled()
        try:
            state = self._inspect()
        except BackendError as exc:  # the daemon does not answer: this attempt's end is unknown
            return self._unknown(exc)
        if state is not None and state.running:  # the client died, the container did not
            self._notes.append("the docker client ended while its container ran on; waited")
            how = self._wait_container(how)
            state = self._inspect()
        try:
            return self._classify(how, state)
        finally:
            self._remove(self.name)  # it has ended: removed off the slot's path

    def _inspect(self) -> ContainerState | None:
        """``docker inspect``, asked again over a few seconds when the daemon stalls."""
        for delay in _RETRIES:
            try:
                return self._cli.inspect(self.name)
            except BackendError:
                if delay is None:
                    raise
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _unknown(self, exc: BackendError) -> AttemptEnd:
        """A failed attempt whose end docker could not tell; its container is removed if the
        daemon lets us (else by label, at the end of the run or on resume)."""
        with contextlib.suppress(BackendError):
            self._cli.remove([self.name])
        reason = f"docker could not tell how the container ended ({exc})"
        started = self._client.started
        return AttemptEnd(
            EndKind.SPAWN_ERROR, None, None, reason, False, started, time.time(), None, 0
        )

    def _wait_client(self) -> str:
        """Until the client exits ("exited"), the timeout ("timeout") or a cancel."""
        while True:
            if self._client_exited(0):
                return "cancelled" if self._hard else "exited"
            if self._cancelled:
                return "cancelled"
            left = self._left()
            if left is not None and left <= 0:
                return "timeout"
            self._client_exited(left)

    def _left(self) -> float | None:
        deadline = self.deadline
        return None if deadline is None else deadline - time.monotonic()

    def _client_exited(self, timeout: float | None) -> bool:
        """Sleep up to ``timeout`` on the client's pidfd and the wake-up pipe; True once the
        client has exited."""
        poller = select.poll()
        fd = self._client.exit_fd
        if fd is not None:
            poller.register(fd, select.POLLIN)
        elif timeout is None or timeout > _SLICE:
            timeout = _SLICE
        poller.register(self._wake_r, select.POLLIN)
        ms = None if timeout is None else min(_MAX_POLL_MS, math.ceil(max(timeout, 0) * 1000))
        ready = poller.poll(ms)
        if any(f == self._wake_r for f, _ in ready):
            with contextlib.suppress(OSError):
                os.read(self._wake_r, 4096)
        if fd is not None:
            return any(f == fd for f, _ in ready) or bool(select_ready(fd))
        return self._client.end_if_clean() is not None

    def _stop(self, *, graceful: bool) -> None:
        """TERM every process of the container, the grace, then KILL the container."""
        if graceful:
            self._signal_all(signal.SIGTERM)
            deadline = time.monotonic() + self.spec.grace
            while not self._hard:
                left = deadline - time.monotonic()
                if left <= 0 or self._client_exited(left):
                    break
            if self._client_exited(0):
                return
        self._main_killed = True
        self._cli.kill(self.name, "KILL")

    def _signal_all(self, sig: signal.Signals) -> None:
        signal_container(self._cli, self.name, sig)

    def _kill_now(self) -> None:
        with contextlib.suppress(Exception):
            self._cli.remove([self.name])
        with contextlib.suppress(Exception):
            self._client.cancel(hard=True)
            self._client.wait()

    def _client_settled(self) -> None:
        """The client has exited (or is made to), is reaped, and its output is in the log."""
        deadline = time.monotonic() + _SETTLE
        while not self._client_exited(max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                self._client.cancel(hard=True)  # a hung client: its container is killed already
                break
        self._client.wait()

    def _wait_container(self, how: str) -> str:
        """The container runs on without its client: look until it ends, honouring the timeout
        and a cancel."""
        while True:
            state = self._inspect()
            if state is None or not state.running:
                return how
            left = self._left()
            if how == "exited" and (self._cancelled or (left is not None and left <= 0)):
                how = "cancelled" if self._cancelled else "timeout"
                self._stop(graceful=not self._hard and self.spec.grace > 0)
            self._client_exited(_SLICE if left is None else max(0.0, min(_SLICE, left)))

    # -- the verdict -----------------------------------------------------------------------------
    def _classify(self, how: str, state: ContainerState | None) -> AttemptEnd:
        started = self._client.started
        if state is None or not state.started:
            return self._not_started(state)
        code = state.exit_code
        sig = code - 128 if code > 128 and code - 128 in _SIGNALS else None
        rc = -sig if sig is not None else code
        stop = self._stop_detail()
        end = verdict(
            self.spec, how, rc, reaped=True, stop=stop, started=started, pid=self.pid, killed=0
        )
        reason = end.reason
        ended_itself = end.kind not in (EndKind.TIMEOUT, EndKind.CANCELLED)
        if ended_itself and code in (126, 127) and _TINI in self._tail():
            kind = EndKind.NOT_FOUND if code == 127 else EndKind.NOT_EXECUTABLE
            what = "command not found" if code == 127 else "command not executable"
            return _but(end, kind, f"{what}: {self.spec.argv[0]} (in the image)")
        if state.oom_killed:
            reason = f"{reason} (the container ran out of memory: OOMKilled)"
        if sig is not None and end.kind is EndKind.SIGNALED:
            reason = f"{reason} (exit {code} in the container)"
        if self._notes:
            reason = f"{reason}; {'; '.join(self._notes)}"
        return _but(end, end.kind, reason)

    def _not_started(self, state: ContainerState | None) -> AttemptEnd:
        """docker's own failure (exit 125, image or device missing, a bad mount): the task
        never ran. Or its container is gone although it ran (someone removed it)."""
        client = self._client.wait()
        tail = self._tail()
        detail = (state.error if state is not None else "") or _docker_error(tail)
        rc = client.returncode
        if state is None and rc != 125 and not _said_by_docker(tail):
            why = "its container was removed while it ran (by someone else?)"
            sig = client.signal or ("SIGKILL" if rc == 137 else None)
            why += f" (the docker client: {client.reason})"
            end = AttemptEnd(EndKind.SIGNALED, None, sig, why, False, client.started,
                             time.time(), self.pid, 0)  # fmt: skip
            return end
        kind = EndKind.SPAWN_ERROR
        low = detail.lower()
        names_it = bool(self.spec.argv) and self.spec.argv[0] in detail
        if "executable file not found" in low or ("no such file or directory" in low and names_it):
            kind = EndKind.NOT_FOUND
        elif "permission denied" in low and names_it:
            kind = EndKind.NOT_EXECUTABLE
        why = f"docker could not start the container (exit {rc}): {detail or 'no detail'}"
        return AttemptEnd(kind, None, None, why, False, self._client.started, time.time(), None, 0)

    def _stop_detail(self) -> str:
        if self._hard or self.spec.grace <= 0:
            return "SIGKILL sent"
        return "SIGTERM ignored, SIGKILL sent" if self._main_killed else "stopped by SIGTERM"

    def _tail(self) -> str:
        return log_tail(self.spec.log_path, max_lines=10)

    def _close(self) -> None:
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def select_ready(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


_DOCKER_CHATTER = ("Usage:", "Run 'docker", "See 'docker", "Options:")


def _said_by_docker(tail: str) -> bool:
    """Whether the log ends with the docker CLI's own complaint (not the task's output)."""
    return any(
        line.startswith(("docker: ", "unknown flag", "invalid argument", *_DOCKER_CHATTER))
        for line in tail.splitlines()
    )


def _docker_error(tail: str) -> str:
    """docker's own complaint in the log: its ``docker: ...`` line (``Error response from
    daemon: ...``), else its first line that is not usage chatter (``unknown flag: --x``)."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("docker: "):
            return line.removeprefix("docker: ").strip()
    for line in lines:
        if not line.startswith(_DOCKER_CHATTER):
            return line
    return lines[0] if lines else ""


def _but(end: AttemptEnd, kind: EndKind, reason: str) -> AttemptEnd:
    return AttemptEnd(
        kind,
        end.returncode if kind is not EndKind.NOT_FOUND else 127,
        end.signal,
        reason,
        end.oom,
        end.started,
        end.ended,
        end.pid,
        end.killed,
    )
