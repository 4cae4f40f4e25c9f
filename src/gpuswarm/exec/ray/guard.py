"""The node-side guard of one slot actor: its attempts do not outlive it.

When a node's raylet dies (the node is cut off, its head is gone, ``ray stop``) Ray ends the
slot actors on it, and kills their direct children; an attempt's descendants (the training
script under ``sh -c``, a torchrun's workers) would go on holding the GPU while the driver runs
the task again elsewhere. So every actor starts a guard first: a process outside the actor's
tree (double-forked before the actor becomes a child subreaper, in a session of its own),
reading the actor's pipe. The actor tells it each attempt it starts (``+ TOKEN PID GRACE``) and
ends (``- TOKEN``); when the pipe reaches its end (the actor died, however) the guard ends what
is still listed -- TERM to each attempt's session, process group and every process carrying its
token, then KILL after the grace -- and exits. A guard whose actor ended normally has nothing
listed and exits at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import IO

import psutil

TOKEN_VAR = "GPUSWARM_ATTEMPT_TOKEN"  # as exec.local.tree sets it in every attempt's env
MAX_GRACE = 30.0
_SETTLE = 5.0  # seconds of KILL rounds at most


class Guard:
    """The actor's end of its guard (one per slot actor). Writes never block the actor for
    long and never fail it: without a guard the actor works as before."""

    def __init__(self) -> None:
        self._pipe: IO[bytes] | None = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuswarm.exec.ray.guard"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
            )
        except OSError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)  # the first process forks the guard and exits at once
        self._pipe = proc.stdin

    @property
    def running(self) -> bool:
        return self._pipe is not None

    def watch(self, token: str, pid: int | None, grace: float) -> None:
        if pid is not None:
            self._say(f"+ {token} {pid} {grace:.3f}\n")

    def unwatch(self, token: str) -> None:
        self._say(f"- {token}\n")

    def _say(self, line: str) -> None:
        if self._pipe is None:
            return
        try:
            self._pipe.write(line.encode())
            self._pipe.flush()
        except OSError:
            self._pipe = None


def _members(watched: dict[str, tuple[int, float]]) -> list[psutil.Process]:
    """Every live process of the watched attempts: in a leader's session or group, or carrying
    a watched token in its environment (an escapee that made a session of its own)."""
    leaders = {pid for pid, _ in watched.values()}
    tokens = set(watched)
    me = os.getpid()
    out = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if os.getsid(proc.pid) in leaders or os.getpgid(proc.pid) in leaders:
                out.append(proc)
                continue
            if proc.environ().get(TOKEN_VAR) in tokens:
                out.append(proc)
        except (psutil.Error, OSError):
            continue
    return out


def _signal(procs: Iterable[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            proc.send_signal(sig)


def end_attempts(watched: dict[str, tuple[int, float]]) -> int:
    """TERM every process of the watched attempts, KILL what is left after the longest grace;
    how many processes there were."""
    procs = _members(watched)
    if not procs:
        return 0
    _signal(procs, signal.SIGTERM)
    grace = min(MAX_GRACE, max((g for _, g in watched.values()), default=0.0))
    _, alive = psutil.wait_procs(procs, timeout=grace)
    deadline = time.monotonic() + _SETTLE
    while alive and time.monotonic() < deadline:
        _signal(alive, signal.SIGKILL)
        _, alive = psutil.wait_procs(alive, timeout=0.5)
    for proc in _members(watched):  # children they forked during the grace
        with contextlib.suppress(psutil.Error, OSError):
            proc.kill()
    return len(procs)


def serve(pipe: IO[bytes]) -> None:
    watched: dict[str, tuple[int, float]] = {}
    for raw in pipe:
        parts = raw.decode(errors="replace").split()
        if len(parts) == 4 and parts[0] == "+":
            with contextlib.suppress(ValueError):
                watched[parts[1]] = (int(parts[2]), float(parts[3]))
        elif len(parts) == 2 and parts[0] == "-":
            watched.pop(parts[1], None)
    if watched:
        end_attempts(watched)


def main() -> None:
    if os.fork() > 0:  # the actor's child exits: the guard is nobody's child in its tree
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a kill of the actor's group spares it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    serve(sys.stdin.buffer)


if __name__ == "__main__":
    main()
