"""Reading a run's queue folders: names, counts and descriptors per state, without changing
anything (every change is :class:`gpuswarm.store.queue.DirQueue`'s)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpuswarm.core.models import Descriptor, Lease, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.names import corrupt_task_id, seq_of, task_id_of


def visible(name: str) -> bool:
    """Not a temp file or a name set aside (``.tmp-``, ``.retry-``, ``.withdrawn-``)."""
    return not name.startswith(".")


_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO put there never blocks a reader
# a claim's read of the descriptor it took: never a FIFO's block, never a symlink followed
CLAIM_READ = _READ | os.O_NOFOLLOW


def read_all(fd: int) -> bytes:
    """A file's bytes by plain reads (no buffered file object: 100k reads at a big run's end)."""
    data = os.read(fd, 1 << 16)
    if len(data) < 1 << 16:
        return data
    chunks = [data]
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


class QueueFolders:
    """The state folders of one run, read."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self._dirs: dict[State, str] = {}  # each state folder's path, as text

    def names(self, state: State) -> list[str]:
        try:
            entries = os.scandir(self.paths.state_dir(state.value))
        except FileNotFoundError:  # skipped/ of a run made before it existed
            return []
        with entries:
            return sorted(e.name for e in entries if visible(e.name))

    def counts(self) -> dict[State, int]:
        out: dict[State, int] = {}
        for state in State:
            try:
                it = os.scandir(self.paths.state_dir(state.value))
            except FileNotFoundError:  # skipped/ of a run made before it existed
                out[state] = 0
                continue
            with it:
                out[state] = sum(1 for e in it if visible(e.name))
        return out

    def read(self, state: State, name: str) -> dict[str, Any] | None:
        """The descriptor, or None when it is unreadable, not JSON or mistyped (a record with
        ``"attempts": "x"`` is as unusable as an empty file: every reader reports it)."""
        desc = self.read_desc(state, name)
        return desc.raw if desc is not None else None

    def read_desc(self, state: State, name: str) -> Descriptor | None:
        """:meth:`read`, typed."""
        try:  # the folder's text once per state: 100k reads at the end of a big run
            folder = self._dirs.get(state)
            if folder is None:
                folder = self._dirs[state] = str(self.paths.state_dir(state.value))
            fd = os.open(f"{folder}/{name}", _READ)
            try:
                data = read_all(fd)
            finally:
                os.close(fd)
            return Descriptor.loads(data.decode())  # UTF-8, as written (json's guess skipped)
        except (OSError, ValueError, RecursionError):
            return None

    def iter_state(self, state: State) -> Iterator[tuple[str, dict[str, Any]]]:
        for name, desc in self.iter_descs(state):
            yield name, desc.raw

    def iter_descs(self, state: State) -> Iterator[tuple[str, Descriptor]]:
        """Every readable descriptor of ``state``, with its file name (unreadable ones skipped)."""
        for name in self.names(state):
            desc = self.read_desc(state, name)
            if desc is not None:
                yield name, desc

    def index(self) -> tuple[dict[str, tuple[State, str]], int]:
        """Task id -> (state, file name) of every readable descriptor, and the highest seq."""
        known: dict[str, tuple[State, str]] = {}
        max_seq = -1
        for state in State:
            for name, desc in self.iter_descs(state):
                if desc.has_id:
                    known[desc.id] = (state, name)
                    max_seq = max(max_seq, desc.seq)
        return known, max_seq

    def ids_taken(self) -> tuple[set[str], int]:
        """Every task id the run has (those set aside in corrupt/ too: a task set aside keeps
        its id) and its highest seq, from the names alone: what an add's new tasks must not
        reuse."""
        taken: set[str] = set()
        max_seq = -1
        for state in State:
            for name in self.names(state):
                taken.add(task_id_of(name))
                max_seq = max(max_seq, seq_of(name))
        corrupt = self.paths.corrupt
        for name in os.listdir(corrupt) if corrupt.is_dir() else []:
            found = corrupt_task_id(name)
            if found is not None:
                taken.add(found)
        return taken, max_seq

    def leases(self) -> list[tuple[str, Lease]]:
        """Each running file's name with its lease (names without one are skipped): what runs
        where, for readers that must not parse the name format themselves."""
        out: list[tuple[str, Lease]] = []
        for name in self.names(State.RUNNING):
            lease = Lease.parse(name)
            if lease is not None:
                out.append((name, lease))
        return out

    def running_path(self, name: str) -> Path:
        return self.paths.state_dir("running") / name
