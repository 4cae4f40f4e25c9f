"""Durable file writes: temp name + fsync + rename, and fsync of the containing folder."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import psutil

from gpuswarm.core import faults


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirSyncer:
    """Folder fsyncs shared by concurrent callers (group commit).

    ``sync(path)`` returns once an fsync of ``path`` that *started after the call* has finished;
    callers that arrive while one runs share the next one, so N slots finishing together pay
    for about two fsyncs, not N.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._state: dict[Path, list[int]] = {}  # path -> [requested, done, syncing]

    def sync(self, path: Path) -> None:
        with self._cond:
            st = self._state.setdefault(path, [0, 0, 0])
            st[0] += 1
            mine = st[0]
            while st[1] < mine:
                if st[2]:
                    self._cond.wait()
                    continue
                st[2], target = 1, st[0]
                self._cond.release()
                try:
                    fsync_dir(path)
                finally:
                    self._cond.acquire()
                    st[2] = 0
                    self._cond.notify_all()
                st[1] = max(st[1], target)


def write_temp(
    path: Path, data: bytes, *, durable: bool = True, mode: int = 0o644, exclusive: bool = False
) -> Path:
    """``data`` in ``path``'s temp file (``.tmp-<name>.<pid>.<thread>`` beside it), fsynced when
    ``durable``; the caller renames it over ``path``. ``exclusive``: created with ``O_EXCL``
    (a leftover of this thread that a crash cut short is removed first)."""
    tmp = path.parent / f".tmp-{path.name}.{os.getpid()}.{threading.get_ident()}"
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:  # exclusive: a write of this thread that a crash cut short
        tmp.unlink()
        fd = os.open(tmp, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)
    return tmp


def sync_files(paths: list[Path]) -> None:
    """Make the data of every file in ``paths`` durable (files of one filesystem, written and
    closed): one ``syncfs(2)`` of their filesystem where it is available and there are several
    (a group commit: one flush instead of one per file), else an fsync of each."""
    if len(paths) > 1 and _SYNCFS is not None:
        fd = os.open(paths[0].parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _SYNCFS(fd) == 0:
                return
        finally:
            os.close(fd)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(
    path: Path,
    data: bytes,
    *,
    durable: bool = True,
    mode: int = 0o644,
    sync_dir: bool = True,
    fenced: bool = False,
) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new file, never half.

    The temp file lives in the same folder (same filesystem, so the rename is atomic) and starts
    with ``.tmp-`` so folder scans can ignore it. ``sync_dir=False`` skips the folder fsync for a
    caller that renames the file on and syncs the destination folder itself.

    ``fenced``: ``path`` is a lease (a claimed descriptor another process may rename away); it
    is replaced only if it still exists, and never re-created: the temp file (created with
    ``O_EXCL``) is swapped with it in one ``renameat2(RENAME_EXCHANGE)``, which fails when
    ``path`` is gone. Then FileNotFoundError is raised and nothing was written.
    """
    tmp = write_temp(path, data, durable=durable, mode=mode, exclusive=fenced)
    faults.point("fsutil.temp_written", path=path, data=data)
    if fenced:
        replace_existing(tmp, path)
    else:
        os.replace(tmp, path)
    if durable and sync_dir:
        fsync_dir(path.parent)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_exchange_supported: list[bool] = []  # [] unknown, [False] after the kernel or fs refused it


def _renameat2() -> Any:
    name = ctypes.util.find_library("c")
    func = getattr(ctypes.CDLL(name, use_errno=True), "renameat2", None) if name else None
    return func


_RENAMEAT2 = _renameat2()


def _syncfs() -> Any:
    name = ctypes.util.find_library("c")
    func = getattr(ctypes.CDLL(name, use_errno=True), "syncfs", None) if name else None
    if func is not None:
        func.argtypes = [ctypes.c_int]
    return func


_SYNCFS = _syncfs()


def replace_existing(tmp: Path, path: Path) -> None:
    """Put ``tmp`` in place of ``path`` only if ``path`` exists; never create ``path``.

    With ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, ext4/xfs/btrfs/tmpfs...) the check and the
    replacement are one atomic step; ``tmp`` then holds the old content and is removed. Where
    the exchange is not supported the fallback checks, then renames: a rename away in between
    (microseconds) is not detected there (a documented limit). ``tmp`` is removed and
    FileNotFoundError raised when ``path`` is gone.
    """
    if _RENAMEAT2 is not None and _exchange_supported != [False]:
        rc = _RENAMEAT2(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(path), _RENAME_EXCHANGE)
        if rc == 0:
            tmp.unlink()
            return
        err = ctypes.get_errno()
        if err == errno.ENOENT:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise FileNotFoundError(errno.ENOENT, "lease file is gone", str(path))
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise OSError(err, os.strerror(err), str(path))
        _exchange_supported[:] = [False]
    if not os.path.lexists(path):
        tmp.unlink()
        raise FileNotFoundError(errno.ENOENT, "lease file is gone", str(path))
    os.replace(tmp, path)


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with that pid exists (a lock or staging folder's
    creator; a pid reused meanwhile reads as alive, the safe side)."""
    return psutil.pid_exists(pid)


def temp_writer_alive(name: str) -> bool:
    """Whether the process that is writing temp file ``name`` (``.tmp-<file>.<pid>.<thread>``,
    as atomic_write_bytes names them) still runs on this host: then the file is a write in
    progress, not one a crash cut short. Another process's pid that was reused keeps a dead
    write's file a while longer, which is harmless (scans skip dot files)."""
    parts = name.rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return False
    pid = int(parts[1])
    return pid != os.getpid() and psutil.pid_exists(pid)


def dumps(obj: Any) -> bytes:
    """Indented JSON, for files people read (run.json, summary.json)."""
    return json.dumps(obj, indent=1, sort_keys=False, default=str).encode() + b"\n"


_COMPACT = json.JSONEncoder(separators=(",", ":"), default=str)


def dumps_compact(obj: Any) -> bytes:
    """Compact JSON (the C encoder: several times faster than indented), for queue files."""
    return _COMPACT.encode(obj).encode() + b"\n"


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, dumps(obj), durable=durable)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), durable=durable)


def read_json(path: Path) -> Any:
    with path.open("rb") as fh:
        return json.loads(fh.read())


def sync_tree(path: Path) -> None:
    """Flush every file written under ``path`` to disk: syncfs(2) where available, else sync(2)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        syncfs = getattr(libc, "syncfs", None)
        if syncfs is not None:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                if syncfs(fd) == 0:
                    return
            finally:
                os.close(fd)
    os.sync()
