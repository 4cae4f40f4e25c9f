"""Run one attempt of a task as a subprocess and leave nothing of it behind.

Each attempt runs in its own session with a unique ``GPUSWARM_ATTEMPT_TOKEN`` in its environment.
While it runs, the supervisor's loop polls its pidfd (``exit_fd``, then ``end_if_clean``), or a
thread sleeps in ``poll()`` on the pidfd and a wake-up pipe (``wait``): no polling loop.
When it ends, for any reason, its process group gets SIGTERM, a grace period, then SIGKILL. Escapees
(``setsid``, double fork) are re-parented to the supervisor, a child subreaper, so they show up as
its direct children; they are attributed by token, process group/session or an earlier snapshot of
the tree. A process without a token is claimed only when no other attempt is live or launching.
Only specific pids are passed to ``waitpid``, never the main pid of another live attempt.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import NamedTuple

import psutil

from gpuswarm.core.logs import LogPump, LogSink, detect_oom, log_tail

TOKEN_VAR = "GPUSWARM_ATTEMPT_TOKEN"
_PR_SET_CHILD_SUBREAPER = 36
_ROUNDS = 10  # bounded passes over leftovers (a killed parent re-parents its children to us)
_SETTLE = 2.0  # seconds to wait for SIGKILLed processes to vanish
_SLICE = 0.05  # poll slice where no pidfd is available
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
_HAVE_CHILDREN_FILE = Path(f"/proc/self/task/{os.getpid()}/children").exists()
_USE_PIDFD = hasattr(os, "pidfd_open")
_LOG_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
# a log written by the LogPump: created fresh (never an existing file or a planted symlink)
_PUMPED_LOG_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_POLL_MS = 3_600_000  # poll() takes a C int of milliseconds: longer waits are re-armed


class EndKind(str, Enum):
    EXITED = "exited"
    SIGNALED = "signaled"
    TIMEOUT = "timeout"
    NOT_FOUND = "not-found"
    NOT_EXECUTABLE = "not-executable"
    CANCELLED = "cancelled"
    SPAWN_ERROR = "spawn-error"


@dataclass(frozen=True)
class LaunchSpec:
    """What to run, where, and how long. ``env`` is the full environment."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    timeout: float | None = None
    grace: float = 10.0
    token: str = ""  # a fresh uuid is used when empty


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended, classified once, with one human line in ``reason``."""

    kind: EndKind
    returncode: int | None
    signal: str | None
    reason: str
    oom: bool
    started: float
    ended: float
    pid: int | None
    killed: int

    @property
    def ok(self) -> bool:
        return self.kind is EndKind.EXITED and self.returncode == 0

    @property
    def duration(self) -> float:
        return self.ended - self.started


class _Stat(NamedTuple):
    zombie: bool
    pgid: int
    sid: int


class _Scan(NamedTuple):
    alive: list[tuple[int, _Stat]]  # our live children in another session, not live mains
    live: frozenset[int]  # main pids of the other live attempts
    quiet: bool  # no launch was in flight

    @property
    def lonely(self) -> bool:
        return self.quiet and not self.live


class _Registry:
    """Live attempts by main pid, and how many launches are between fork and registration."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, Attempt] = {}
        self.launching = 0
        self.subreaper = False


_REG = _Registry()


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux only). Idempotent."""
    if _REG.subreaper:
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
    _REG.subreaper = True
    return True


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
        leader = f"/proc/self/task/{os.getpid()}/children"
        with contextlib.suppress(OSError), open(leader, "rb") as fh:
            return [int(x) for x in fh.read().split()]
    pids: list[int] = []
    with os.scandir("/proc/self/task") as tasks:
        for task in tasks:
            with contextlib.suppress(OSError), open(f"{task.path}/children", "rb") as fh:
                pids.extend(int(x) for x in fh.read().split())
    return pids


def _stat(pid: int) -> _Stat | None:
    try:
        zombie = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        return _Stat(zombie, os.getpgid(pid), os.getsid(pid))
    except (psutil.Error, OSError):
        return None


def _token_of(pid: int) -> str | None:
    """The attempt token in a process's environment; None when absent or unreadable."""
    try:
        return psutil.Process(pid).environ().get(TOKEN_VAR)
    except psutil.Error:
        return None


def _descendants(roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them, from one pass over the process table."""
    kids: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid"]):
        kids.setdefault(proc.info["ppid"], []).append(proc.pid)
    out: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.add(pid)
            stack.extend(kids.get(pid, ()))
    out.discard(os.getpid())
    return out


def _procs(pids: Iterable[int]) -> dict[int, psutil.Process]:
    out: dict[int, psutil.Process] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out[pid] = psutil.Process(pid)
    return out


def _reap(pid: int) -> None:
    """Collect a dead child's status, unless it is the main process of a live attempt."""
    if pid not in _REG.live:
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


def _none_alive(procs: dict[int, psutil.Process]) -> bool:
    if any([_alive(p) for p in procs.values()]):  # a list: check (and reap) every one
        return False
    for proc in procs.values():  # reap zombies re-parented to us while we looked
        _alive(proc)
    return True


def _send(procs: dict[int, psutil.Process], sig: int) -> set[int]:
    sent: set[int] = set()
    for pid, proc in procs.items():
        if _alive(proc):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
                sent.add(pid)
    return sent


def _candidates(owner: Attempt | None) -> _Scan:
    """Our children that may be leftovers; reaps zombies that are safe to reap on the way.

    An attempt's own checks read where its leftovers land (the main thread's children); the
    sweep at the end (``owner`` None) reads every thread's."""
    kids = _my_children(everywhere=owner is None)
    with _REG.lock:
        live = frozenset(pid for pid, att in _REG.live.items() if att is not owner)
        quiet = _REG.launching == 0
    my_sid = os.getsid(0)
    alive: list[tuple[int, _Stat]] = []
    for pid in kids:
        if pid in live or (owner is not None and pid == owner.pid and not owner._reaped):
            continue
        st = _stat(pid)
        if st is None or st.sid == my_sid:  # gone, or one of the supervisor's own helpers
            continue
        if not st.zombie:
            alive.append((pid, st))
        elif quiet or (owner is not None and owner._owns(pid, st, live)):
            _reap(pid)
    return _Scan(alive, live, quiet)


def _wait_until(cond: Callable[[], bool], deadline: float, nap: Callable[[float], bool]) -> bool:
    """Re-check ``cond`` with growing naps: True once it holds, False at the deadline or on stop."""
    delay = 0.002
    while not cond():
        left = deadline - time.monotonic()
        if left <= 0 or nap(min(delay, left)):
            return False
        delay = min(delay * 2, _SLICE)
    return True


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def kill_tree(pids: Iterable[int], grace: float) -> int:
    """SIGTERM ``pids`` and their descendants, wait up to ``grace``, SIGKILL the rest.

    Dead children of ours among them are reaped. Returns how many processes were signalled.
    """
    procs = _procs(_descendants(pids))

    sent = _send(procs, signal.SIGTERM if grace > 0 else signal.SIGKILL)
    if grace <= 0 or not _wait_until(lambda: _none_alive(procs), time.monotonic() + grace, _sleep):
        procs.update(_procs(_descendants(procs)))
        sent |= _send(procs, signal.SIGKILL)
        _wait_until(lambda: _none_alive(procs), time.monotonic() + _SETTLE, _sleep)
    return len(sent)


def find_by_env(name: str, value: str) -> list[int]:
    """Pids of every process (but this one) whose environment has ``name=value``.

    Used after a crash: a dead supervisor's attempts run on in their own sessions, re-parented
    away from us, and their environment is what still ties them to their run.
    """
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(name) == value:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def sweep_orphans(token_prefix: str | None = None, *, grace: float = 1.0) -> int:
    """Kill and reap re-parented children of ours that are not main processes of live attempts.

    With ``token_prefix``, only those whose attempt token starts with it. For supervisor exit.
    """
    scan = _candidates(None)
    pids = []
    for pid, _ in scan.alive:
        token = _token_of(pid)
        if token_prefix is None:
            take = token is not None or scan.quiet
        else:
            take = token is not None and token.startswith(token_prefix)
        if take:
            pids.append(pid)
    return kill_tree(pids, grace) if pids else 0


# -- classification --------------------------------------------------------------------------------
def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _is_shell_c(argv: list[str]) -> bool:
    return len(argv) >= 2 and Path(argv[0]).name in _SHELLS and argv[1].startswith("-")


def _shell_subject(log: Path, needle: str) -> str | None:
    """The name a shell complained about: ``sh: 1: foo: not found`` -> ``foo``."""
    for line in reversed(log_tail(log, max_lines=10).splitlines()):
        parts = [p.strip() for p in line.split(": ")]
        for i, part in enumerate(parts):
            if needle in part.lower():
                if part.lower() == "command not found" and i + 1 < len(parts):
                    return parts[i + 1]
                return parts[i - 1] if i > 0 else None
    return None


def _exit_kind(spec: LaunchSpec, code: int) -> tuple[EndKind, str]:
    if not _is_shell_c(spec.argv) or code not in (126, 127):
        return EndKind.EXITED, f"exit {code}"
    if code == 127:
        name = _shell_subject(spec.log_path, "not found")
        return EndKind.NOT_FOUND, f"command not found: {name}" if name else "command not found"
    name = _shell_subject(spec.log_path, "permission denied")
    what = f"command not executable: {name}" if name else "command not executable"
    return EndKind.NOT_EXECUTABLE, f"{what} (exit 126)"


def _spawn_failure(exc: Exception, spec: LaunchSpec) -> tuple[EndKind, str]:
    name = spec.argv[0]
    if isinstance(exc, OSError):
        detail = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) == str(spec.cwd):
            return EndKind.SPAWN_ERROR, f"cannot enter working directory {spec.cwd}: {detail}"
        if isinstance(exc, FileNotFoundError):
            return EndKind.NOT_FOUND, f"command not found: {name}"
        if isinstance(exc, PermissionError) or exc.errno == errno.ENOEXEC:
            return EndKind.NOT_EXECUTABLE, f"command not executable: {name} ({detail.lower()})"
        return EndKind.SPAWN_ERROR, f"cannot start {name}: {detail}"
    return EndKind.SPAWN_ERROR, f"cannot start {name!r}: {exc}"


def _make_log_dir(folder: Path) -> None:
    """``<task dir>/attempt-<n>``: one mkdir per level, no lookups first (hot path)."""
    for level in (folder.parent, folder):
        try:
            os.mkdir(level)  # noqa: PTH102
        except FileExistsError:
            pass
        except FileNotFoundError:
            os.makedirs(level, exist_ok=True)  # noqa: PTH103 - a deeper parent is missing


def _fresh_log_dir(folder: Path) -> None:
    """``<task dir>/attempt-<n>``, made new: an earlier attempt may have planted it (a folder
    whose ``output.log`` is a symlink to a file outside the run); that is removed first (never
    followed). The task dir must be a real folder, not a symlink. One mkdir per level when
    nothing is in the way (hot path)."""
    try:
        os.mkdir(folder.parent)  # noqa: PTH102
    except FileNotFoundError:
        os.makedirs(folder.parent, exist_ok=True)  # noqa: PTH103 - a deeper parent is missing
    except FileExistsError:
        if folder.parent.is_symlink():
            why = "the task workspace is a symlink"
            raise OSError(errno.ELOOP, why, str(folder.parent)) from None
    try:
        os.mkdir(folder)  # noqa: PTH102
    except FileExistsError:
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)  # symlinks inside are removed, never followed
        else:
            folder.unlink()
        os.mkdir(folder)  # noqa: PTH102


def _precheck(spec: LaunchSpec) -> str | None:
    if not spec.argv:
        return "empty command"
    if not spec.cwd.is_dir():
        return f"working directory does not exist: {spec.cwd}"
    return None


# -- the attempt -----------------------------------------------------------------------------------
class Attempt:
    """One launched attempt. :meth:`wait` from one thread; :meth:`cancel` from any."""

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
            _make_log_dir(spec.log_path.parent)
            log = os.open(spec.log_path, _LOG_FLAGS, 0o600)  # private; the child gets a copy
        except OSError as exc:
            return attempt._failed(EndKind.SPAWN_ERROR, f"cannot open log {spec.log_path}: {exc}")
        try:
            pre = _precheck(spec)
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
            _fresh_log_dir(spec.log_path.parent)
            log = os.open(spec.log_path, _PUMPED_LOG_FLAGS, 0o600)  # private, like the unpumped log
        except OSError as exc:
            return self._failed(EndKind.SPAWN_ERROR, f"cannot open log {spec.log_path}: {exc}")
        try:
            sink = pump.add(log, limit or (256 << 20))  # the pump owns the log from now on
        except OSError as exc:
            os.close(log)
            return self._failed(EndKind.SPAWN_ERROR, f"cannot open a pipe for the log: {exc}")
        self._pump, self._sink = pump, sink
        pre = _precheck(spec)
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
        with _REG.lock:
            _REG.launching += 1
        try:
            self._popen = subprocess.Popen(
                self.spec.argv,
                env=env,
                cwd=self.spec.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=keep,
            )
        except (OSError, ValueError, TypeError) as exc:
            self._close()
            return _spawn_failure(exc, self.spec)
        finally:
            with _REG.lock:  # registered before `launching` drops: never mistaken for a stray
                _REG.launching -= 1
                if self._popen is not None:
                    self.pid, self._reaped = self._popen.pid, False
                    _REG.live[self.pid] = self
        if _USE_PIDFD and self.pid is not None:
            with contextlib.suppress(OSError):  # no pidfd: _block() polls in slices
                self._pidfd = os.pidfd_open(self.pid)
        return None

    def _failed(self, kind: EndKind, reason: str) -> Attempt:
        now = time.time()
        self._end = AttemptEnd(kind, None, None, reason, False, self.started, now, None, 0)
        return self

    @property
    def done(self) -> bool:
        """True once :meth:`wait` has returned (or the attempt never started)."""
        return self._end is not None

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

    @property
    def cancelled(self) -> bool:
        """Whether a stop cancelled this attempt (its end may still be an exit 0)."""
        return self._cancelled

    @property
    def exit_fd(self) -> int | None:
        """A pidfd that polls readable once the main process exits (None: no pidfd here; then
        only :meth:`wait` can tell)."""
        return self._pidfd

    @property
    def deadline(self) -> float | None:
        """When the timeout expires, on the ``time.monotonic`` clock."""
        return None if self.spec.timeout is None else self._t0 + self.spec.timeout

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

    # -- waiting -----------------------------------------------------------------------------------
    def _block(self, timeout: float | None, *, main: bool) -> None:
        """Sleep until ``timeout``, a cancel() wake-up, or (``main``) the main process exits."""
        poller = select.poll()
        if main and self._pidfd is not None:
            poller.register(self._pidfd, select.POLLIN)
        elif main and (timeout is None or timeout > _SLICE):
            timeout = _SLICE  # no pidfd: poll the main process in slices
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
        with _REG.lock:
            if self.pid is not None and _REG.live.get(self.pid) is self:
                del _REG.live[self.pid]
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

    # -- leftovers ---------------------------------------------------------------------------------
    def _owns(self, pid: int, st: _Stat, live: frozenset[int]) -> bool:
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
        scan = _candidates(self)
        out = []
        for pid, st in scan.alive:
            if self._owns(pid, st, scan.live):
                out.append(pid)
                continue
            token = _token_of(pid)
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
                _candidates(self)  # reap our zombies of the group, then look again
        return True

    def _snapshot(self) -> dict[int, psutil.Process]:
        roots = self._claimed()
        if not self._reaped and self.pid is not None:
            roots.append(self.pid)
        procs = _procs(_descendants(roots) - {self.pid}) if roots else {}
        self._seen.update(procs)
        return procs

    def _signal(self, procs: dict[int, psutil.Process], sig: int) -> None:
        self._killed |= _send(procs, sig)  # first, so that the count sees them alive
        if self.pid is not None and self._group_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def _all_gone(self, procs: dict[int, psutil.Process]) -> bool:
        if not self._poll_main() or self._group_alive():
            return False
        return _none_alive(procs)

    def _terminate(self, *, graceful: bool) -> None:
        """SIGTERM the group and the tree, wait out the grace, then SIGKILL what is left."""
        procs = self._snapshot()
        if graceful and self.spec.grace > 0 and not self._hard:
            self._signal(procs, signal.SIGTERM)
            deadline = time.monotonic() + self.spec.grace
            if _wait_until(lambda: self._all_gone(procs), deadline, self._nap):
                return
            procs.update(self._snapshot())
        self._main_killed = self._main_killed or not self._poll_main()
        self._signal(procs, signal.SIGKILL)
        _wait_until(
            lambda: self._all_gone(procs),
            time.monotonic() + _SETTLE,
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
        rc = self._rc
        sig = _signame(-rc) if rc < 0 else None
        if how == "timeout":
            kind, reason = EndKind.TIMEOUT, f"timeout after {self.spec.timeout:g}s"
            reason += f" ({self._stop_detail()})"
        elif how == "cancelled" and self._reaped and rc == 0:
            # it exited 0 in the stop's grace period: judged like any end (the supervisor hands
            # it back unless that makes it done; see ``cancelled``)
            kind, reason = EndKind.EXITED, "exit 0 during the stop's grace period"
        elif how == "cancelled":
            kind, reason = EndKind.CANCELLED, f"cancelled ({self._stop_detail()})"
        elif sig is not None:
            kind, reason = EndKind.SIGNALED, f"killed by {sig}"
        else:
            kind, reason = _exit_kind(self.spec, rc)
        failed = kind in (EndKind.SIGNALED, EndKind.TIMEOUT) or (kind is EndKind.EXITED and rc != 0)
        oom = failed and detect_oom(self.spec.log_path)  # only a failure can be an OOM
        if oom:
            reason = f"CUDA out of memory ({reason})"
        return AttemptEnd(
            kind=kind,
            returncode=rc if rc >= 0 else None,
            signal=sig,
            reason=reason,
            oom=oom,
            started=self.started,
            ended=time.time(),
            pid=self.pid,
            killed=len(self._killed),
        )
