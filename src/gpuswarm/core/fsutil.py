"""Durable file writes: temp name + fsync + rename, and fsync of the containing folder."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import stat
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
    tmp = temp_path(path)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:  # exclusive: a write of this thread that a crash cut short
        tmp.unlink()
        fd = os.open(tmp, flags, mode)
    _fill(fd, tmp, data, durable=durable)
    return tmp


def temp_path(path: Path) -> Path:
    """``path``'s temp file as :func:`write_temp` names it (``.tmp-<name>.<pid>.<thread>``)."""
    return path.parent / f".tmp-{path.name}.{os.getpid()}.{threading.get_ident()}"


class Spares:
    """One thread's exchanged-out files, written again as its next temp files.

    A fenced save swaps its temp file with the lease (``RENAME_EXCHANGE``): the temp name then
    holds the lease's old inode. Unlinking it frees an inode per save, and on ext4 without a
    journal every later file creation in that folder's group first walks past each inode freed
    in the last minutes (``recently_deleted``): a cost that grows with the run (measured in
    BENCHMARKS.md). So a group commit keeps the old inode instead and writes its next temp
    file into it: renamed to the new temp name, opened without following a link, checked to be
    a regular file with one link (a file planted there is never written through; it is
    unlinked and a new temp file made), overwritten, and cut to its new length where that is
    shorter (the one block of a descriptor is kept, not freed). :meth:`drop` removes what is
    left; a crash leaves them as a dead writer's temp files, which recovery removes as any."""

    LIMIT = 64

    def __init__(self) -> None:
        self._paths: list[Path] = []

    def write(self, path: Path, data: bytes) -> Path:
        """``data`` in ``path``'s temp file, not fsynced (the group's flush does that)."""
        tmp = temp_path(path)
        while self._paths:
            reused = self._reuse(self._paths.pop(), tmp)
            if reused is None:
                continue
            fd, size = reused
            _fill(fd, tmp, data, durable=False, old_size=size)
            return tmp
        return write_temp(path, data, durable=False, exclusive=True)

    @staticmethod
    def _reuse(spare: Path, tmp: Path) -> tuple[int, int] | None:
        try:
            os.rename(spare, tmp)
            fd = os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # gone, or a symlink put there (ELOOP): a new temp file instead
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return fd, st.st_size
        os.close(fd)  # another file's second name: never written through
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None

    def keep(self, spare: Path) -> None:
        """``spare`` (a swapped-out file) is this thread's to write again."""
        if len(self._paths) < self.LIMIT:
            self._paths.append(spare)
        else:
            spare.unlink(missing_ok=True)

    def drop(self) -> None:
        """Remove every kept file."""
        paths, self._paths = self._paths, []
        for spare in paths:
            with contextlib.suppress(OSError):
                spare.unlink()

    def __len__(self) -> int:
        return len(self._paths)


def _fill(fd: int, tmp: Path, data: bytes, *, durable: bool, old_size: int = 0) -> None:
    """Write ``data`` into ``tmp`` (open as ``fd``, closed here) from its start, cut to its
    length where the file held more (``old_size``), fsynced when ``durable``; on any error the
    temp file is removed and the error raised."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if old_size > len(data):  # a shorter descriptor than the one it held
            os.ftruncate(fd, len(data))
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.close(fd)


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


def _libc_function(name: str) -> Any:
    """The C library's ``name`` (None where it has none), from the symbols this process has
    loaded (``dlopen(NULL)``): the interpreter's own C library, with no ``ldconfig`` run to
    find it (``ctypes.util.find_library`` spawns one: milliseconds of every start)."""
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name, None)
    except OSError:
        return None


_RENAMEAT2 = _libc_function("renameat2")


def _syncfs() -> Any:
    func = _libc_function("syncfs")
    if func is not None:
        func.argtypes = [ctypes.c_int]
    return func


_SYNCFS = _syncfs()


def replace_existing(tmp: Path, path: Path, spares: Spares | None = None) -> None:
    """Put ``tmp`` in place of ``path`` only if ``path`` exists; never create ``path``.

    With ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, ext4/xfs/btrfs/tmpfs...) the check and the
    replacement are one atomic step; ``tmp`` then holds the old content and is removed (kept in
    ``spares``, when given, to be written again: see :class:`Spares`). Where
    the exchange is not supported the fallback checks, then renames: a rename away in between
    (microseconds) is not detected there (a documented limit). ``tmp`` is removed and
    FileNotFoundError raised when ``path`` is gone.
    """
    if _RENAMEAT2 is not None and _exchange_supported != [False]:
        rc = _RENAMEAT2(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(path), _RENAME_EXCHANGE)
        if rc == 0:
            if spares is not None:
                spares.keep(tmp)  # the lease's old inode: written again, not freed
            else:
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


COMPACT = json.JSONEncoder(separators=(",", ":"), default=str)  # queue files' encoder


def dumps_compact(obj: Any) -> bytes:
    """Compact JSON (the C encoder: several times faster than indented), for queue files."""
    return COMPACT.encode(obj).encode() + b"\n"


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, dumps(obj), durable=durable)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), durable=durable)


def read_json(path: Path) -> Any:
    with path.open("rb") as fh:
        return json.loads(fh.read())


def sync_tree(path: Path) -> None:
    """Flush every file written under ``path`` to disk: syncfs(2) where available, else sync(2)."""
    if _SYNCFS is not None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if _SYNCFS(fd) == 0:
                return
        finally:
            os.close(fd)
    os.sync()
