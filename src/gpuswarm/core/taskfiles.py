"""Reading files a task controls (its completion file, its attempt logs) without trusting them.

A task can leave anything at a path gpuswarm reads later: a FIFO (an ``open()`` that blocks
forever), a symlink to ``/dev/zero`` or to a secret outside the run, a device, a folder, a huge
file. Every such file is opened with ``O_NONBLOCK | O_NOFOLLOW | O_NOCTTY``, checked to be a
regular file with ``fstat``, and read with a size limit; a path built from placeholders must stay
inside its folder once symlinks are resolved. Problems are :class:`UnsafeFile` (an ``OSError``,
so callers that already tolerate unreadable files keep doing so), with a reason for people.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
RDWR_FLAGS = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC

_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISLNK, "a symlink"),
)


class UnsafeFile(OSError):
    """A file a task controls is not something gpuswarm reads: the message says why."""


def kind_of(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path | str, flags: int = READ_FLAGS, *, dir_fd: int | None = None) -> int:
    """Open a regular file without blocking and without following a final symlink (``path``
    relative to the folder open at ``dir_fd`` when given).

    Raises FileNotFoundError when it is missing, UnsafeFile when it is anything but a regular
    file (a symlink, a FIFO, a device, ...), OSError for other failures."""
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(errno.ELOOP, "is a symlink (not followed)", str(path)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeFile(errno.EINVAL, f"is {kind_of(mode)}, not a regular file", str(path))
    return fd


def read_limited(path: Path | str, limit: int) -> bytes:
    """The whole content of a regular file of at most ``limit`` bytes (UnsafeFile if larger)."""
    fd = open_regular(path)
    try:
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise UnsafeFile(errno.EFBIG, f"is larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_tail(path: Path | str, max_bytes: int) -> tuple[bytes, bool]:
    """The last ``max_bytes`` of a regular file and whether its start was cut off; ``(b"",
    False)`` for anything unreadable, missing or not a regular file (a log is only a view)."""
    try:
        fd = open_regular(path)
    except OSError:
        return b"", False
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        data = os.pread(fd, max_bytes, start)
        return data, start > 0
    except OSError:
        return b"", False
    finally:
        os.close(fd)


def open_beneath(root: Path, rel: str) -> int:
    """Open the regular file ``rel`` below the folder ``root`` without following any symlink
    on the way (each folder opened ``O_NOFOLLOW`` from the one above it, the file by
    :func:`open_regular`'s rules): for a folder a task may have written into, such as the
    source folder it copies from. ``..``, an absolute ``rel`` or a NUL byte is UnsafeFile."""
    parts = Path(rel).parts
    if "\0" in rel or not parts or Path(rel).is_absolute() or ".." in parts:
        raise UnsafeFile(errno.EINVAL, "is no plain path below its folder", rel)
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                below = os.open(part, dir_flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeFile(exc.errno, "has a symlink on its way", rel) from None
                raise
            os.close(fd)
            fd = below
        return open_regular(parts[-1], READ_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)


def same_bytes(a: int, b: int, limit: int) -> bool:
    """Whether the regular files open at ``a`` and ``b`` hold the same bytes: their sizes first
    (no read when they differ or pass ``limit``), then at most ``limit`` bytes of each."""
    size = os.fstat(a).st_size
    if size != os.fstat(b).st_size or size > limit:
        return False
    offset = 0
    while offset < size:
        chunk = min(1 << 20, size - offset)
        left, right = os.pread(a, chunk, offset), os.pread(b, chunk, offset)
        if left != right or not left:
            return False
        offset += len(left)
    return True


def inside(root: Path, rel: str) -> Path:
    """``root / rel`` with every symlink resolved; UnsafeFile unless it stays inside ``root``.

    ``rel`` comes from a template with placeholders: a value may make it absolute, climb with
    ``..`` or hold a NUL byte; and a task may have replaced a folder on the way by a symlink."""
    if "\0" in rel:
        raise UnsafeFile(errno.EINVAL, "the path holds a NUL byte", rel.replace("\0", "\\0"))
    base = Path(os.path.realpath(root.parent)) / root.name  # the workspace itself may be a
    target = Path(os.path.realpath(base / rel))  # symlink the task planted: never resolved
    if target != base and base not in target.parents:
        raise UnsafeFile(
            errno.EXDEV, f"leads outside the task workspace (to {target})", str(root / rel)
        )
    return target
