"""Attempt logs: the pump that writes them under their cap, tails, out-of-memory detection.

A log is a file a task controls (it knows the path and may replace it by a FIFO or a symlink):
every read goes through :mod:`gpuswarm.core.taskfiles` (no blocking, no symlink followed, bounded).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import select
import stat
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from gpuswarm.core.taskfiles import RDWR_FLAGS, open_regular, read_tail

_OOM_SCAN_BYTES = 65536
_OOM_MARKERS = (
    "CUDA out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "HIP out of memory",
    "hipErrorOutOfMemory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
)
_GPU_WORD = re.compile(r"\b(cuda|hip|gpu)\b", re.IGNORECASE)


def _read_tail(path: Path, max_bytes: int) -> tuple[bytes, bool]:
    """The last ``max_bytes`` of a file, and whether the start was cut off."""
    return read_tail(path, max_bytes)


def _last_state(line: str) -> str:
    parts = [p for p in line.split("\r") if p]
    return parts[-1] if parts else ""


def log_tail(path: Path, max_lines: int = 20, max_bytes: int = 16384) -> str:
    """The last lines of a log; ``\\r``-rewritten progress lines keep only their last state."""
    data, cut = _read_tail(path, max_bytes)
    lines = data.decode("utf-8", errors="replace").split("\n")
    if cut and len(lines) > 1:
        lines = lines[1:]  # a partial first line
    if lines and lines[-1] == "":
        lines.pop()
    lines = [_last_state(line) for line in lines]
    return "\n".join(lines[-max_lines:]) if max_lines > 0 else ""


def detect_oom(path: Path) -> bool:
    """Whether the last 64 KiB of a log show a GPU out-of-memory error."""
    text = _read_tail(path, _OOM_SCAN_BYTES)[0].decode("utf-8", errors="replace")
    if any(marker in text for marker in _OOM_MARKERS):
        return True
    if "out of memory" not in text.lower():
        return False
    return any(
        "out of memory" in line.lower() and _GPU_WORD.search(line) for line in text.splitlines()
    )


CUT_MARKER = b"\n[gpuswarm: %d bytes of output dropped here to keep the log under %d bytes]\n"


def cap_log(path: Path, limit: int) -> int:
    """Keep a growing log under ``limit`` bytes: its head, a marker, and its latest output.

    For a log written straight by its task (no :class:`LogPump`): the task writes with
    O_APPEND, so after the truncation its next writes land after the kept tail. A log that is
    a symlink, a FIFO or anything but a regular file is left alone. Returns the bytes dropped
    (0 when the log is within the limit).

    One ``lstat`` decides when nothing is to cut (the hot path: every commit asks): a log
    within the limit, missing, or no regular file is not opened at all; one over it is opened
    without following a symlink and its size is read again from the open file.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if st.st_size <= limit or not stat.S_ISREG(st.st_mode):
        return 0
    try:
        fd = open_regular(path, RDWR_FLAGS)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        return _cut(fd, size, limit, 0)[1] if size > limit else 0
    finally:
        os.close(fd)


def _cut(fd: int, size: int, limit: int, dropped_before: int) -> tuple[int, int]:
    """Cut the middle out of the log open at ``fd`` (``size`` bytes): keep its first and last
    quarter-limit and a marker between. Returns (the new size, bytes dropped by this cut)."""
    keep = max(1, limit // 4)
    tail = os.pread(fd, keep, max(0, size - keep))
    os.ftruncate(fd, keep)
    dropped = size - keep - len(tail)
    block = CUT_MARKER % (dropped_before + dropped, limit) + tail
    os.pwrite(fd, block, keep)
    return keep + len(block), dropped


# -- the pump --------------------------------------------------------------------------------------
_CHUNK = 1 << 20
_FINISH_MAX = 16 << 20  # what finish() drains at most (writers outside our tree may go on)
_SPLICE = getattr(os, "splice", None)
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_PIPE_SIZE = 1 << 20  # the default /proc/sys/fs/pipe-max-size: no privilege needed
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_EPOLL = hasattr(select, "epoll")
_READABLE = select.EPOLLIN if _EPOLL else select.POLLIN


class LogSink:
    """One attempt's output: the read end of its stdout pipe and its log file."""

    def __init__(self, read_fd: int, write_fd: int, log_fd: int, limit: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd  # the child's stdout and stderr; held until finish()
        self.log_fd = log_fd
        self.limit = max(1, limit)
        self.size = os.fstat(log_fd).st_size
        self.dropped = 0  # bytes cut out to hold the cap
        self.lost = 0  # bytes that could not be written (a full disk)
        self.eof = False
        self.closed = False
        self.lock = threading.Lock()
        self._splice = _SPLICE is not None

    def close_write_end(self) -> None:
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1

    def pump(self, budget: int = _CHUNK) -> bool:
        """Move what the pipe holds (up to ``budget``) into the log, holding the cap: the log
        never grows past ``limit`` (the middle is cut first). False once the pipe is at EOF
        or has nothing more for now. Call with ``lock`` held."""
        moved = 0
        while moved < budget:
            room = self.limit - self.size
            if room <= 0:
                with contextlib.suppress(OSError):
                    self.size, cut = _cut(self.log_fd, self.size, self.limit, self.dropped)
                    self.dropped += cut
                os.lseek(self.log_fd, self.size, os.SEEK_SET)
                room = self.limit - self.size
            try:
                if room <= 0:  # a cap too small for the marker: drop what comes
                    n = len(os.read(self.read_fd, _CHUNK))
                    self.dropped += n
                else:
                    n = self._move(min(room, budget - moved))
            except BlockingIOError:
                return False
            except OSError:  # a full disk, an I/O error: drop the output, never block the task
                try:
                    n = len(os.read(self.read_fd, _CHUNK))
                except BlockingIOError:
                    return False
                self.lost += n
                if n == 0:
                    self.eof = True
                    return False
                moved += n
                continue
            if n == 0:
                self.eof = True
                return False
            moved += n
        return True

    def _move(self, count: int) -> int:
        if self._splice and _SPLICE is not None:
            try:
                n: int = _SPLICE(self.read_fd, self.log_fd, count, flags=_SPLICE_FLAGS)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                self._splice = False  # a filesystem splice does not write to: copy
            else:
                self.size += n
                return n
        data = os.read(self.read_fd, count)
        view = memoryview(data)
        while view:
            view = view[os.write(self.log_fd, view) :]
        self.size += len(data)
        return len(data)


class Keeper(Protocol):
    """Something that keeps each attempt's pipe and log while the pump owns them, so that what
    a task prints after this process died still reaches its log (``exec.local.keeper``)."""

    def hold(self, sink: LogSink) -> None: ...

    def release(self, sink: LogSink) -> None: ...


class LogPump:
    """One thread that moves every attempt's output from its pipe into its log file.

    The task writes into a pipe, never into the file: the cap is held while it writes (the
    log never passes ``max_log_mb``, whatever a burst), and a task that replaces its
    ``output.log`` by a FIFO or a symlink changes nothing of what is written where. When an
    attempt ends, :meth:`finish` drains what is left in its pipe (in the caller's thread), so
    the log is complete before it is read for metrics, the OOM check and the tail.

    The thread wakes only when a task prints: pipes are watched with epoll, which sees a pipe
    registered or removed by another thread at once (no wake-up per attempt), and the sink
    holds the write end until :meth:`finish`, so a task's exit is no hang-up event either.
    """

    def __init__(self, keeper: Keeper | None = None) -> None:
        self._keeper = keeper
        self._poller: Any = select.epoll() if _EPOLL else select.poll()
        self._sinks: dict[int, LogSink] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poller.register(self._wake_r, _READABLE)
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-pump", daemon=True)
        self._thread.start()

    def add(self, log_fd: int, limit: int) -> LogSink:
        """A pipe whose write end becomes an attempt's stdout/stderr; takes ``log_fd``."""
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(read_fd, False)  # the read end only: the task's writes block
        with contextlib.suppress(OSError):  # room for what a task prints while nobody reads
            fcntl.fcntl(read_fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        sink = LogSink(read_fd, write_fd, log_fd, limit)
        if self._keeper is not None:
            self._keeper.hold(sink)
        with self._lock:
            self._sinks[read_fd] = sink
            self._poller.register(read_fd, _READABLE)
        if not _EPOLL:
            self._wake()  # poll() watches the new pipe from its next call only
        return sink

    def finish(self, sink: LogSink) -> None:
        """The attempt has ended: drain its pipe into the log now, then close it (a writer
        left outside our process tree is not read from then on). The pump thread stops
        watching it first, so closing the write end wakes nobody."""
        self._unwatch(sink)
        if self._keeper is not None and not sink.closed:
            self._keeper.release(sink)
        sink.close_write_end()
        with sink.lock:
            if sink.closed:
                return
            drained = 0
            while not sink.eof and drained < _FINISH_MAX:
                before = sink.size + sink.dropped + sink.lost
                more = sink.pump()
                drained += sink.size + sink.dropped + sink.lost - before
                if not more:
                    break
            sink.closed = True
        for fd in (sink.read_fd, sink.log_fd):  # unwatched: a poll() in flight that still
            with contextlib.suppress(OSError):  # reports the number finds no sink, or the
                os.close(fd)  # new one that reuses it, by a lookup under the lock

    def stop(self) -> None:
        """End the pump thread; sinks never finished are drained and closed."""
        with self._lock:
            left = list(self._sinks.values())
        for sink in left:
            self.finish(sink)
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _unwatch(self, sink: LogSink) -> None:
        with self._lock:
            if self._sinks.get(sink.read_fd) is sink:
                del self._sinks[sink.read_fd]
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._poller.unregister(sink.read_fd)

    def _run(self) -> None:
        while not self._stopping:
            try:
                self._pass()
            except Exception:  # never die: every task would block on its full pipe
                time.sleep(0.01)

    def _pass(self) -> None:
        """One poll: move what is ready."""
        for fd, _ in self._poller.poll():
            if fd == self._wake_r:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 4096)
                continue
            with self._lock:
                sink = self._sinks.get(fd)
            if sink is None:
                continue
            with sink.lock:
                if not sink.closed and not sink.eof:
                    try:
                        sink.pump()
                    except OSError:  # the pipe itself broke: nothing more comes from it
                        sink.eof = True
                quiet = sink.eof and not sink.closed
            if quiet:  # EOF polls readable for ever: stop watching it until finish()
                with self._lock, contextlib.suppress(KeyError, ValueError, OSError):
                    if self._sinks.get(fd) is sink:
                        self._poller.unregister(fd)
