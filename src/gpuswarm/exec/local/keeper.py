"""The log keeper: what a task prints while no supervisor reads still reaches its log.

Each attempt writes into a pipe that the supervisor's :class:`~gpuswarm.core.logs.LogPump`
drains into ``output.log``. When the supervisor is SIGKILLed, the task runs on (its own session)
and the pipe's buffer takes what it prints; but a pipe lives only while a process holds it, so
once the task exits, everything still in the buffer would be gone: no log line, no metric.

So a supervisor that pumps logs starts one small helper process, the keeper (lazily, at its
first attempt; ``python -m gpuswarm.exec.local.keeper``), in its own session. For every attempt
the supervisor hands it a copy of the pipe's read end and of the log's fd over a unix socket
(``SCM_RIGHTS``) and takes them back when the attempt's log is finished. While the supervisor
lives the keeper only holds them. When the socket hangs up without a goodbye (the supervisor
died), the keeper becomes the pump: it moves what every held pipe has, and what the tasks still
print, into their logs under the same cap (:class:`~gpuswarm.core.logs.LogSink`), and exits once
every pipe is at its end (each task and what it left holding the pipe has exited). SIGTERM:
it moves what the pipes hold now and exits.

A reclaiming supervisor (resume, a ``work`` sibling) ends the dead one's attempts first and then
waits for its keeper to finish (:func:`settle_keepers`), so the log is whole before the orphan
is judged and its metrics are read. The keeper is found by its environment
(``GPUSWARM_LOG_KEEPER_RUN`` / ``GPUSWARM_LOG_KEEPER_OWNER``: not the tasks' variables, so it is
never counted as an attempt).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import psutil

from gpuswarm.core.logs import LogSink
from gpuswarm.exec.local.tree import forget_helper, note_helper

RUN_VAR = "GPUSWARM_LOG_KEEPER_RUN"
OWNER_VAR = "GPUSWARM_LOG_KEEPER_OWNER"
_TASK_VARS = ("GPUSWARM_RUN_DIR", "GPUSWARM_OWNER", "GPUSWARM_ATTEMPT_TOKEN", "GPUSWARM_TASK_ID")
_SEND_TIMEOUT = 5.0  # a keeper that does not take a message in this long is given up on
_SETTLE = 1.5  # how long a reclaimer waits for a dead supervisor's keeper to finish by itself
_MESSAGE = 64


class LogKeeper:
    """The supervisor's side: starts the keeper, hands it each attempt's pipe and log.

    Best effort: when the keeper cannot start or stops answering, attempts run as before
    (their output after a supervisor's death is then only what the pipe held while they ran).
    Thread-safe (attempts launch and finish in several threads)."""

    def __init__(self, run_dir: str, owner: str) -> None:
        self._env = {k: v for k, v in os.environ.items() if k not in _TASK_VARS}
        self._env.update({RUN_VAR: run_dir, OWNER_VAR: owner})
        here = str(Path(__file__).resolve().parents[3])  # the gpuswarm this supervisor runs
        self._env["PYTHONPATH"] = os.pathsep.join(
            [here, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._broken = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def hold(self, sink: LogSink) -> None:
        """Give the keeper a copy of ``sink``'s pipe read end and log (before the task starts)."""
        with self._lock:
            if self._sock is None and not self._broken:
                self._start()
            self._send(b"H %d %d" % (sink.read_fd, sink.limit), [sink.read_fd, sink.log_fd])

    def release(self, sink: LogSink) -> None:
        """The attempt's log is being finished by the supervisor: the keeper lets it go."""
        with self._lock:
            self._send(b"D %d" % sink.read_fd)

    def close(self) -> None:
        """Say goodbye (the keeper exits without pumping anything) and reap it.

        Once the goodbye is queued the keeper has nothing left to do but close the copies it
        holds, which its death does too: it is killed, not waited for (a keeper still starting
        up, ~60 ms of interpreter, held up every short run's end). Without a goodbye (the
        socket broke) it may be moving pipes into logs: it gets its time."""
        with self._lock:
            said = self._send(b"B")
            sock, self._sock, self._broken = self._sock, None, True
            if sock is not None:
                sock.close()
            proc = self._proc
        if proc is None:
            return
        if said:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # our child, not reaped yet: its pid cannot be another's
        try:
            proc.wait(_SEND_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        forget_helper(proc.pid)

    def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gpuswarm.exec.local.keeper", str(theirs.fileno())],
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # no terminal signal of ours, no kill of our group
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        except OSError:
            mine.close()
            self._broken = True
            return
        finally:
            theirs.close()
        note_helper(self._proc.pid)  # ours, never an escapee of an attempt
        mine.settimeout(_SEND_TIMEOUT)
        self._sock = mine

    def _send(self, message: bytes, fds: Sequence[int] = ()) -> bool:
        """Whether the message was queued to the keeper."""
        if self._sock is None:
            return False
        try:
            socket.send_fds(self._sock, [message], list(fds), socket.MSG_NOSIGNAL)
        except OSError:  # it died or hangs: no keeping from now on
            self._sock.close()
            self._sock, self._broken = None, True
            return False
        return True


def settle_keepers(pids: Sequence[int]) -> None:
    """Wait for the keepers of dead supervisors to move what is left into the logs (they exit
    once every pipe they hold is at its end: call this after the attempts were ended); a keeper
    still busy after a few seconds (a writer outside the attempts holds a pipe) is told to move
    what the pipes hold now and stop (SIGTERM), then killed."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=_SETTLE)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(alive, timeout=_SETTLE)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=_SETTLE)


# -- the keeper process ----------------------------------------------------------------------------
class _Stop(Exception):
    """SIGTERM: move what the pipes hold now, then exit."""


def _on_term(signum: int, frame: object) -> None:
    raise _Stop


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


Held = dict[int, tuple[int, int, int]]  # key -> (pipe read end, log fd, cap)


def _hold(sock: socket.socket, held: Held) -> str:
    """Take what the supervisor hands over into ``held`` until it says goodbye ("bye": all
    closed) or dies ("eof"); on a non-blocking socket also "alive" once nothing is queued."""
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 2)
        except InterruptedError:
            continue
        except BlockingIOError:
            return "alive"
        except ConnectionResetError:
            return "eof"
        words = msg.split()
        if not words:  # EOF: the supervisor is gone without a goodbye
            _close(fds)
            return "eof"
        key = int(words[1]) if len(words) > 1 and words[1].isdigit() else -1
        if words[0] in (b"H", b"D") and key in held:
            _close(held.pop(key)[:2])
        if words[0] == b"H" and len(words) == 3 and len(fds) == 2:
            held[key] = (fds[0], fds[1], int(words[2]))
            continue
        _close(fds)
        if words[0] == b"B":
            for read_fd, log_fd, _ in held.values():
                _close((read_fd, log_fd))
            held.clear()
            return "bye"


def _sinks(held: Held) -> dict[int, LogSink]:
    sinks = {}
    for read_fd, log_fd, limit in held.values():
        try:
            os.set_blocking(read_fd, False)
            os.lseek(log_fd, 0, os.SEEK_END)  # where the supervisor's pump left off
            sinks[read_fd] = LogSink(read_fd, -1, log_fd, limit)
        except OSError:
            _close((read_fd, log_fd))
    return sinks


def _drain(sink: LogSink) -> None:
    try:
        while sink.pump():
            pass
    except OSError:
        sink.eof = True


def pump_until_done(held: Held) -> None:
    """Move what every held pipe has into its log until each is at its end (or SIGTERM)."""
    sinks = _sinks(held)
    poller = select.poll()
    for fd in sinks:
        poller.register(fd, select.POLLIN)
    try:
        while sinks:
            for fd, _ in poller.poll():
                sink = sinks.get(fd)
                if sink is None:
                    continue
                _drain(sink)
                if sink.eof:
                    poller.unregister(fd)
                    del sinks[fd]
                    _close((sink.read_fd, sink.log_fd))
    except _Stop:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends it as it is
        for sink in sinks.values():
            _drain(sink)
            _close((sink.read_fd, sink.log_fd))


def main(argv: Sequence[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only SIGTERM (a reclaimer) or SIGKILL end it
    signal.signal(signal.SIGTERM, _on_term)
    held: Held = {}
    try:
        sock = socket.socket(fileno=int(argv[0]))
        end = _hold(sock, held)
    except _Stop:  # what is queued first: a supervisor alive pumps its pipes itself
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sock.setblocking(False)
        end = _hold(sock, held)
        if end != "eof":
            return 0
        for sink in _sinks(held).values():
            _drain(sink)
            _close((sink.read_fd, sink.log_fd))
        return 0
    if end == "eof":
        pump_until_done(held)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
