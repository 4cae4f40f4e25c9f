"""What this process wrote when it created a command list's run (issue 31): the end-of-run
outputs of a 100,000-task run read only the descriptors that changed since.

A command list's descriptors differ only in id, name, command and seq (one template,
``app/setup.py``), so their rows in results.tsv differ only in id, name, seq and state.
:class:`Created` keeps, per descriptor file this process wrote (staged by ``create_run``, or
moved from the spool into pending/ by its :class:`~gpuswarm.store.spool.Streamer`), the file's
identity when written (inode, size, mtime) and the task's name; and one descriptor's bytes, the
shared part. :func:`gpuswarm.outputs.results.collect` stats each file it lists: one whose
identity is unchanged holds the bytes written, so its row is the shared one with its id, name,
seq and state; any other is read from disk as before. Every change of a descriptor writes a
file that is then renamed in (a new inode, or in a committer's group commit an inode another
move swapped out, the task's own first one included: written again, so a new mtime and, with
the attempt it gained, a new size; the identity is all three, never the inode alone), and a
move keeps the file (a rename: the same inode, size and mtime, and the same bytes), so a
rewrite by anyone (this process, another host's supervisor, a queue verb) is read, never taken
from here. A spooled task never written into pending/ yet is
the spool's line as created.
"""

from __future__ import annotations

import os
import threading
from array import array

from gpuswarm.core.models import LEASE_SEP
from gpuswarm.store.names import seq_of


def identity(st: os.stat_result) -> int:
    """One number for a file's inode, size and mtime (never 0: 0 is "not written")."""
    return hash((st.st_ino, st.st_size, st.st_mtime_ns)) or 1


def seq_in(name: str) -> int | None:
    """The seq of a descriptor's file name without a lease part, None for another name."""
    seq = seq_of(name)
    return seq if seq >= 0 and LEASE_SEP not in name else None


class Created:
    """The descriptors of one run this process created, by seq (see the module): a number a
    task (an array of them, 8 bytes each, and the task's name), not a record: 100,000 tasks
    cost some 7 MB for the whole run."""

    __slots__ = ("_ids", "_lock", "_names", "_spooled", "shared", "spool_lines")

    def __init__(self) -> None:
        self._ids = array("q")  # by seq: the file's identity when written, 0 while spooled
        self._names: list[str] = []  # by seq: the task's name
        self._lock = threading.Lock()  # the streamer's thread writes while others read
        self.shared: bytes | None = None  # one of them, whole: the fields they share
        self._spooled: list[str] | None = []  # the spool's file names while it is there
        self.spool_lines: int | None = None  # how many lines the spool was made with

    def __len__(self) -> int:
        return len(self._names)

    def _add(self, name: str, ident: int, task_name: str, blob: bytes) -> bool:
        seq = seq_in(name)
        if seq != len(self._names):  # created in seq order from 0: another is not ours
            return False
        self._ids.append(ident)
        self._names.append(task_name)
        if self.shared is None:
            self.shared = blob
        return True

    def wrote(self, name: str, fd: int, task_name: str, blob: bytes) -> None:
        """``name`` was written through ``fd`` (before its close) with ``blob``."""
        self._add(name, identity(os.fstat(fd)), task_name, blob)

    def spooled(self, name: str, task_name: str, blob: bytes) -> None:
        """``name`` went into the spool (not yet a file)."""
        if self._add(name, 0, task_name, blob) and self._spooled is not None:
            self._spooled.append(name)

    def spooled_rows(
        self, start: int, names: list[str], task_names: list[str], first: bytes
    ) -> None:
        """Spool lines ``names`` (of tasks ``task_names``, the first's bytes ``first``) went
        into the spool from seq ``start`` on, in order (store/spool.py's second layout)."""
        if start != len(self._names) or len(names) != len(task_names) or self._spooled is None:
            return  # not ours from seq 0 on: spool_names() then says the spool must be read
        self._ids.extend(array("q", bytes(8 * len(names))))
        self._names.extend(task_names)
        if self.shared is None:
            self.shared = first
        self._spooled.extend(names)

    def moved_in(self, name: str, fd: int) -> None:
        """The streamer wrote spooled ``name`` into pending/ through ``fd`` (the spool's bytes)."""
        seq = seq_in(name)
        with self._lock:
            if seq is not None and seq < len(self._ids):
                self._ids[seq] = identity(os.fstat(fd))

    def spool_gone(self) -> None:
        """Every spooled task is in pending/ and the spool removed: its names are not needed."""
        self._spooled = None

    def name_if_unchanged(self, name: str, folder: int) -> str | None:
        """The task name of ``name`` in the folder open as ``folder`` when that file is one
        this process wrote, unchanged; None otherwise (not ours, rewritten, gone)."""
        seq = seq_in(name)
        if seq is None or seq >= len(self._ids) or not (ident := self._ids[seq]):
            return None
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return None
        return self._names[seq] if identity(st) == ident else None

    def spool_names(self) -> list[str] | None:
        """The name of every line of the run's spool, None when not every one was
        remembered here (then the spool itself is read)."""
        names = self._spooled
        if names is None:
            return [] if self.spool_lines is not None else None
        return names if self.spool_lines == len(names) else None

    def spooled_name(self, name: str) -> str | None:
        """The task name of a spooled ``name`` this process created (the spool's line is never
        rewritten), None for another."""
        seq = seq_in(name)
        return self._names[seq] if seq is not None and seq < len(self._names) else None
