"""One ``research loop`` per experiment.

Two loops on one experiment corrupt its story: the second's mode leaks into the first's rounds,
each counts the other's variants as its own and decides on runs the other is still making. So
a loop holds ``loop.lock`` (an exclusive flock, released by the kernel when its process dies,
even by SIGKILL) for as long as it runs, and writes into it who it is; a second loop is refused
(exit 2) naming the running one. The holder's record is advisory (for the message): the lock
is the flock, so a stale record of a dead loop never blocks anyone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import TypedDict

from gpuswarm.core.errors import ResearchError
from gpuswarm.research.experiment import ExpPaths

_RECORD_MAX = 4096


class LoopHolder(TypedDict, total=False):
    """The running loop's record in the lock file (what ``one_loop`` writes)."""

    pid: int
    host: str
    mode: str
    started: float


def _holder(fd: int) -> LoopHolder:
    """The running loop's record in the lock file ({} when unreadable; a field of another
    type is left out)."""
    data: object = None
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(os.pread(fd, _RECORD_MAX, 0).decode("utf-8", "replace"))
    out: LoopHolder = {}
    if not isinstance(data, dict):
        return out
    if isinstance(pid := data.get("pid"), int):
        out["pid"] = pid
    if isinstance(host := data.get("host"), str):
        out["host"] = host
    if isinstance(mode := data.get("mode"), str):
        out["mode"] = mode
    if isinstance(started := data.get("started"), int | float):
        out["started"] = float(started)
    return out


def _describe(holder: LoopHolder) -> str:
    if not holder:
        return "another process"
    since = time.strftime("%H:%M:%S", time.localtime(float(holder.get("started", 0))))
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
        f"{holder.get('mode', '?')} mode, since {since}"
    )


def ensure_free(paths: ExpPaths) -> None:
    """Refuse now (exit 2, naming it) when a loop runs the experiment: before a second loop
    checks its agent or draws its live view. ``one_loop`` is what holds the lock."""
    with one_loop(paths, "?", record=False):
        pass


@contextlib.contextmanager
def one_loop(paths: ExpPaths, mode: str, *, record: bool = True) -> Iterator[None]:
    """Hold the experiment's loop lock while the block runs (``record``: saying who holds
    it); a ResearchError (exit 2) naming the loop that holds it already."""
    fd = os.open(paths.loop_lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ResearchError(
                f"a research loop already runs experiment {paths.root.name} "
                f"({_describe(_holder(fd))}): one loop per experiment. Follow it with "
                "`gpuswarm research status`, stop it with Ctrl-C in its terminal (or "
                "SIGTERM to its pid), or start a second experiment with `research init --tag`"
            ) from None
        if not record:
            yield
            return
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "mode": mode,
            "started": time.time(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)
