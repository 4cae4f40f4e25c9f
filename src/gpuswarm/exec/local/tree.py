"""The process table side of the local backend: the child subreaper, tree kills, the sweep.

Escapees of an attempt (``setsid``, double fork) are re-parented to the supervisor, a child
subreaper, so they show up as its direct children; :func:`candidates` lists them for an
attempt to claim (by token, process group/session or an earlier snapshot of its tree). Only
specific pids are passed to ``waitpid``, never the main pid of another live attempt.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple, Protocol

import psutil

TOKEN_VAR = "GPUSWARM_ATTEMPT_TOKEN"
_PR_SET_CHILD_SUBREAPER = 36
SETTLE = 2.0  # seconds to wait for SIGKILLed processes to vanish
SLICE = 0.05  # poll slice where no pidfd is available
_HAVE_CHILDREN_FILE = Path(f"/proc/self/task/{os.getpid()}/children").exists()


class Stat(NamedTuple):
    zombie: bool
    pgid: int
    sid: int


class Scan(NamedTuple):
    alive: list[tuple[int, Stat]]  # our live children in another session, not live mains
    live: frozenset[int]  # main pids of the other live attempts
    quiet: bool  # no launch was in flight

    @property
    def lonely(self) -> bool:
        return self.quiet and not self.live


class Attempt(Protocol):
    """A live attempt as the process table side sees it (:class:`.process.Attempt`): declared
    here, so that this module never imports the attempt that imports it."""

    pid: int | None
    _reaped: bool  # its main process was reaped: its pid may be another process's now

    def _owns(self, pid: int, st: Stat, live: frozenset[int]) -> bool: ...


class Registry:
    """Live attempts by main pid, and how many launches are between fork and registration."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, object] = {}  # main pid -> its Attempt (compared by identity)
        self.launching = 0
        self.subreaper = False
        self.helpers: set[int] = set()  # our own helper processes (the log keeper): no leftovers


REGISTRY = Registry()


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux only). Idempotent."""
    if REGISTRY.subreaper:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl.restype = ctypes.c_int
        ulong = ctypes.c_ulong
        prctl.argtypes = [ctypes.c_int, ulong, ulong, ulong, ulong]
        if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    REGISTRY.subreaper = True
    return True


def note_helper(pid: int) -> None:
    """``pid`` is a helper of this supervisor (in its own session): never an attempt's escapee."""
    with REGISTRY.lock:
        REGISTRY.helpers.add(pid)


def forget_helper(pid: int) -> None:
    with REGISTRY.lock:
        REGISTRY.helpers.discard(pid)


# -- reading the process table ---------------------------------------------------------------------
def _my_children(*, everywhere: bool = True) -> list[int]:
    """Our direct children: cheap on Linux (one small file per thread), a full scan elsewhere.

    ``everywhere=False`` reads only the main thread's file: where an orphan is re-parented to
    us (a child subreaper), Linux gives it to the first live thread of the group, the main
    thread; so while that thread lives, every possible leftover of an attempt is listed there
    (the other threads' files hold only the main processes they launched)."""
    if not _HAVE_CHILDREN_FILE:
        with contextlib.suppress(psutil.Error):
            return [c.pid for c in psutil.Process().children()]
        return []
    if not everywhere and threading.main_thread().is_alive():
        with contextlib.suppress(OSError):
            return _leader_children()
    pids: list[int] = []
    with os.scandir("/proc/self/task") as tasks:
        for task in tasks:
            with contextlib.suppress(OSError), open(f"{task.path}/children", "rb") as fh:
                pids.extend(int(x) for x in fh.read().split())
    return pids


_READ_MAX = 1 << 16
_leader: list[tuple[int, int]] = []  # (our pid, the main thread's children file, kept open)
_leader_lock = threading.Lock()


def _leader_children() -> list[int]:
    """The main thread's children (every attempt's leftover check reads them: the hot path).

    The file stays open and is read with ``pread`` at offset 0, which makes procfs list them
    afresh on each read (a seq_file restarts at 0): one syscall instead of open, read, close.
    A forked child of ours opens its own; a list too long for one read is read whole."""
    with _leader_lock:
        if not _leader or _leader[0][0] != os.getpid():
            path = f"/proc/self/task/{os.getpid()}/children"
            _leader[:] = [(os.getpid(), os.open(path, os.O_RDONLY | os.O_CLOEXEC))]
        fd = _leader[0][1]
    data = os.pread(fd, _READ_MAX, 0)
    if len(data) >= _READ_MAX:  # more than one read holds (thousands of children)
        with open(f"/proc/self/task/{os.getpid()}/children", "rb") as fh:
            data = fh.read()
    return [int(x) for x in data.split()]


def _stat(pid: int) -> Stat | None:
    try:
        zombie = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        return Stat(zombie, os.getpgid(pid), os.getsid(pid))
    except (psutil.Error, OSError):
        return None


def token_of(pid: int) -> str | None:
    """The attempt token in a process's environment; None when absent or unreadable."""
    try:
        return psutil.Process(pid).environ().get(TOKEN_VAR)
    except psutil.Error:
        return None


def _children_table() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        kids.setdefault(proc.info["ppid"], []).append(proc.pid)
    return kids


_SHARED_TABLE_SECONDS = 0.2
_shared_table: tuple[float, dict[int, list[int]]] = (-1.0, {})
_shared_lock = threading.Lock()


def shared_descendants(roots: Iterable[int]) -> set[int]:
    """:func:`descendants` from a process table at most 0.2 s old, shared by every caller:
    the VRAM sampler asks each live attempt for its pids in one look (``Handle.pids``), and one
    pass over /proc serves them all. Never for killing: that reads the table fresh."""
    global _shared_table
    with _shared_lock:
        now = time.monotonic()
        if now - _shared_table[0] > _SHARED_TABLE_SECONDS:
            _shared_table = (now, _children_table())
        kids = _shared_table[1]
    return descendants(roots, kids)


def descendants(roots: Iterable[int], kids: dict[int, list[int]] | None = None) -> set[int]:
    """``roots`` and every process below them, from one pass over the process table (or the
    parent -> children table ``kids`` given)."""
    if kids is None:
        kids = _children_table()
    out: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack.extend(kids.get(pid, ()))
    out.discard(os.getpid())
    return out


def processes(pids: Iterable[int]) -> dict[int, psutil.Process]:
    out: dict[int, psutil.Process] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out[pid] = psutil.Process(pid)
    return out


def _reap(pid: int) -> None:
    """Collect a dead child's status, unless it is the main process of a live attempt."""
    if pid not in REGISTRY.live:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie; a zombie child of ours is reaped on the way."""
    try:
        if not proc.is_running():
            return False
        if proc.status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.Error:
        return False
    _reap(proc.pid)
    return False


def none_alive(procs: dict[int, psutil.Process]) -> bool:
    if any([_alive(p) for p in procs.values()]):  # a list: check (and reap) every one
        return False
    for proc in procs.values():  # reap zombies re-parented to us while we looked
        _alive(proc)
    return True


def signal_alive(procs: dict[int, psutil.Process], sig: int) -> set[int]:
    sent: set[int] = set()
    for pid, proc in procs.items():
        if _alive(proc):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                sent.add(pid)
    return sent


def candidates(owner: Attempt | None) -> Scan:
    """Our children that may be leftovers; reaps zombies that are safe to reap on the way.

    An attempt's own checks read where its leftovers land (the main thread's children); the
    sweep at the end (``owner`` None) reads every thread's."""
    kids = _my_children(everywhere=owner is None)
    with REGISTRY.lock:
        live = frozenset(pid for pid, att in REGISTRY.live.items() if att is not owner)
        quiet = REGISTRY.launching == 0
        helpers = frozenset(REGISTRY.helpers)
    my_sid = os.getsid(0)
    alive: list[tuple[int, Stat]] = []
    for pid in kids:
        if pid in live or pid in helpers:
            continue
        if owner is not None and pid == owner.pid and not owner._reaped:
            continue
        st = _stat(pid)
        if st is None or st.sid == my_sid:  # gone, or one of the supervisor's own helpers
            continue
        if not st.zombie:
            alive.append((pid, st))
        elif quiet or (owner is not None and owner._owns(pid, st, live)):
            _reap(pid)
    return Scan(alive, live, quiet)


def wait_until(cond: Callable[[], bool], deadline: float, nap: Callable[[float], bool]) -> bool:
    """Re-check ``cond`` with growing naps: True once it holds, False at the deadline or on stop."""
    delay = 0.002
    while not cond():
        left = deadline - time.monotonic()
        if left <= 0 or nap(min(delay, left)):
            return False
        delay = min(delay * 2, SLICE)
    return True


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def kill_tree(pids: Iterable[int], grace: float) -> int:
    """SIGTERM ``pids`` and their descendants, wait up to ``grace``, SIGKILL the rest.

    Dead children of ours among them are reaped. Returns how many processes were signalled.
    """
    procs = processes(descendants(pids))

    sent = signal_alive(procs, signal.SIGTERM if grace > 0 else signal.SIGKILL)
    if grace <= 0 or not wait_until(lambda: none_alive(procs), time.monotonic() + grace, _sleep):
        procs.update(processes(descendants(procs)))
        sent |= signal_alive(procs, signal.SIGKILL)
        wait_until(lambda: none_alive(procs), time.monotonic() + SETTLE, _sleep)
    return len(sent)


def find_by_env(name: str, value: str) -> list[int]:
    """Pids of every process (but this one) whose environment has ``name=value``.

    Used after a crash: a dead supervisor's attempts run on in their own sessions, re-parented
    away from us, and their environment is what still ties them to their run.
    """
    return find_by_envs({name: value})[name]


def find_by_envs(wanted: dict[str, str]) -> dict[str, list[int]]:
    """For each ``name: value`` of ``wanted``, the pids (but ours) whose environment has it,
    in one pass over the process table."""
    found: dict[str, list[int]] = {name: [] for name in wanted}
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        for name, value in wanted.items():
            if env.get(name) == value:
                found[name].append(proc.pid)
                break
    return found


def sweep_orphans(token_prefix: str | None = None, *, grace: float = 1.0) -> int:
    """Kill and reap re-parented children of ours that are not main processes of live attempts.

    With ``token_prefix``, only those whose attempt token starts with it. For supervisor exit.
    """
    scan = candidates(None)
    pids = []
    for pid, _ in scan.alive:
        token = token_of(pid)
        if token_prefix is None:
            take = token is not None or scan.quiet
        else:
            take = token is not None and token.startswith(token_prefix)
        if take:
            pids.append(pid)
    return kill_tree(pids, grace) if pids else 0
