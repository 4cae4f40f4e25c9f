"""What this process wrote when it created a command list's run (issue 31): the end-of-run
outputs of a 100,000-task run read only the descriptors that changed since.

A command list's descriptors differ only in id, name, command and seq (one template,
``app/setup.py``), so their rows in results.tsv differ only in id, name, seq and state.
:class:`Created` keeps, per descriptor file this process wrote (staged by ``create_run``, or
moved from the spool into pending/ by its :class:`~gpuswarm.store.spool.Streamer`), the file's
identity when written (inode, size, mtime) and the task's name; and one descriptor's bytes, the
shared part. :func:`gpuswarm.outputs.results.collect` stats each file it lists: one whose
identity is unchanged holds the bytes written, so its row is the shared one with its id, name,
seq and state; any other is read from disk as before. Every change of a descriptor is a new file
(temp + rename: a new inode) and a move keeps the file (a rename: the same inode, size and
mtime, and the same bytes), so a rewrite by anyone (this process, another host's supervisor, a
queue verb) is read, never taken from here. A spooled task never written into pending/ yet is
the spool's line as created.
"""

from __future__ import annotations

import os
import threading

Identity = tuple[int, int, int]  # st_ino, st_size, st_mtime_ns of the file as written


def identity(st: os.stat_result) -> Identity:
    return st.st_ino, st.st_size, st.st_mtime_ns


class Created:
    """The descriptors of one run this process created, by file name (see the module)."""

    __slots__ = ("_files", "_lock", "_spooled", "shared", "spool_lines")

    def __init__(self) -> None:
        # file name -> (its identity when written, None while only in the spool; task name)
        self._files: dict[str, tuple[Identity | None, str]] = {}
        self._lock = threading.Lock()  # the streamer's thread writes while others read
        self.shared: bytes | None = None  # one of them, whole: the fields they share
        self._spooled: list[str] = []  # the spool's names, in its order
        self.spool_lines: int | None = None  # how many lines the spool was made with

    def __len__(self) -> int:
        return len(self._files)

    def wrote(self, name: str, fd: int, task_name: str, blob: bytes) -> None:
        """``name`` was written through ``fd`` (before its close) with ``blob``."""
        self._files[name] = (identity(os.fstat(fd)), task_name)
        if self.shared is None:
            self.shared = blob

    def spooled(self, name: str, task_name: str, blob: bytes) -> None:
        """``name`` went into the spool (not yet a file)."""
        self._files[name] = (None, task_name)
        self._spooled.append(name)
        if self.shared is None:
            self.shared = blob

    def moved_in(self, name: str, fd: int) -> None:
        """The streamer wrote spooled ``name`` into pending/ through ``fd`` (the spool's bytes)."""
        with self._lock:
            got = self._files.get(name)
            if got is not None:
                self._files[name] = (identity(os.fstat(fd)), got[1])

    def name_if_unchanged(self, name: str, folder: int) -> str | None:
        """The task name of ``name`` in the folder open as ``folder`` when that file is the one
        this process wrote, unchanged; None otherwise (not ours, rewritten, gone)."""
        got = self._files.get(name)
        if got is None or got[0] is None:
            return None
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return None
        return got[1] if identity(st) == got[0] else None

    def spool_names(self) -> list[str] | None:
        """The name of every line of the run's spool, None when not every one was
        remembered here (then the spool itself is read)."""
        return self._spooled if self.spool_lines == len(self._spooled) else None

    def spooled_name(self, name: str) -> str | None:
        """The task name of a spooled ``name`` this process created (the spool's line is never
        rewritten), None for another."""
        got = self._files.get(name)
        return got[1] if got is not None else None
