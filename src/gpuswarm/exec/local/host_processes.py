"""Processes of this host that are no task: the research loop's own runners, found by an
environment variable and stopped warm (SIGTERM, then the tree after a grace). Only exec/local
touches processes; :mod:`gpuswarm.app.api` hands these to research.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable

import psutil

from gpuswarm.exec.local import tree


def with_env(name: str, value: str, *, argv_has: str | None = None) -> list[int]:
    """Pids of the processes (but this one) whose environment has ``name=value`` and, when
    given, whose argv holds ``argv_has``."""
    pids = tree.find_by_env(name, value)
    if argv_has is None:
        return pids
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if argv_has in psutil.Process(pid).cmdline():
                out.append(pid)
    return out


def stop(pids: Iterable[int], grace: float) -> int:
    """SIGTERM each process (its own warm stop), then after ``grace`` kill the trees of those
    still alive. Returns how many were asked to stop."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.terminate()
            procs.append(proc)
    deadline = time.monotonic() + grace
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not _gone(p)]
    if alive:
        tree.kill_tree([p.pid for p in alive], 0)
    return len(procs)


def _gone(proc: psutil.Process) -> bool:
    """Ended: no such process, or a zombie (it has exited; its parent, perhaps a subreaper that
    is not ours, has not reaped it yet: psutil counts it as running)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def kill_tree(pids: Iterable[int], grace: float) -> int:
    """SIGTERM ``pids`` and their descendants, SIGKILL what is left after ``grace``."""
    return tree.kill_tree(pids, grace)
