"""The queue folders of a run being created, before the rename that makes it visible.

Nobody else can see a staged run, so its descriptors need no lease, no journal line and no
per-file fsync: :func:`gpuswarm.store.runs.create_run` syncs the filesystem once
(:func:`gpuswarm.core.fsutil.sync_tree`) and then renames the whole run into place.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact
from gpuswarm.core.jsontemplate import JsonTemplate
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import STATES, RunPaths
from gpuswarm.store.blocked import Edge, write_blocked, write_edges
from gpuswarm.store.created import Created
from gpuswarm.store.names import descriptor_name


class Encoded(NamedTuple):
    """A pending descriptor already encoded (``dumps_compact`` of ``Descriptor.new(task, seq)``):
    a command list's, filled into one template (:mod:`gpuswarm.core.jsontemplate`)."""

    priority: int
    seq: int
    task_id: str
    blob: bytes
    name: str = ""  # the task's name (its row's, store/created.py)


Row = tuple[str, str, "str | list[str]"]  # a command list's (id, name, command)


def filled(template: JsonTemplate, row: Sequence[object], seq: int) -> bytes:
    """The descriptor file's bytes of a command list's task: ``row`` and ``seq`` put in."""
    return template.fill((*row, seq)).encode() + b"\n"


class Templated:
    """A command list's descriptors as one template and a row per task (seq: the row's
    index): iterated, each :class:`Encoded` in seq order; the spool keeps the template once and
    the rows (store/spool.py) instead of every descriptor's bytes."""

    __slots__ = ("priority", "rows", "template")

    def __init__(self, template: JsonTemplate, priority: int, rows: Sequence[Row]) -> None:
        """``template``'s holes: 0 the id, 1 the name, 2 the command, 3 the seq."""
        if template.holes != 4:
            raise ValueError(f"a descriptor template has 4 holes, not {template.holes}")
        self.template = template
        self.priority = priority
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def let_go(self) -> None:
        """Written: its rows are not kept (a run's whole list, some 25 MB for 100k tasks, would
        stay with whoever still holds this while the run goes on)."""
        self.rows = ()

    def __iter__(self) -> Iterator[Encoded]:
        template, priority = self.template, self.priority
        for seq, row in enumerate(self.rows):
            yield Encoded(priority, seq, row[0], filled(template, row, seq), row[1])


def create_layout(paths: RunPaths) -> None:
    """The state folders and corrupt/ under ``.parallel/``."""
    paths.parallel.mkdir(parents=True, exist_ok=True, mode=0o700)
    for state in STATES:
        paths.state_dir(state).mkdir(exist_ok=True)
    paths.corrupt.mkdir(exist_ok=True)


def encoded(item: Descriptor | Encoded) -> tuple[str, bytes, bool]:
    """``(file name, bytes, skipped)`` of a new descriptor (skipped: excluded by the config)."""
    if isinstance(item, Encoded):
        return descriptor_name(item.priority, item.seq, item.task_id), item.blob, False
    name = descriptor_name(item.priority, item.seq, item.id)
    return name, dumps_compact(item.raw), item.state == State.SKIPPED.value


def write_skipped(paths: RunPaths, name: str, blob: bytes) -> None:
    atomic_write_bytes(paths.state_dir(State.SKIPPED.value) / name, blob, durable=False)


def write_pending(
    paths: RunPaths, descriptors: Iterable[Descriptor | Encoded], created: Created | None = None
) -> int:
    """Write descriptors into ``pending/`` (``skipped/`` for excluded ones) of a staged run;
    ``created`` remembers the encoded ones (store/created.py).

    No per-file fsync: the caller syncs the filesystem once before it makes the staged run
    visible with a rename, so 100k tasks cost one sync, not 100k.
    """
    count = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    folder = os.open(paths.state_dir("pending"), os.O_RDONLY | os.O_DIRECTORY)
    edges: list[Edge] = []  # issue 35: tasks after prerequisites wait in blocked/
    try:
        for item in descriptors:
            if not isinstance(item, Encoded):  # a command list's have no prerequisites
                desc = item
                if desc.state != State.SKIPPED.value and desc.has_prerequisites:
                    name = descriptor_name(desc.priority, desc.seq, desc.id)
                    count += write_blocked(paths, desc, name, edges)
                    continue
            name, blob, skipped = encoded(item)
            count += 1
            if skipped:  # excluded: never pending
                write_skipped(paths, name, blob)
                continue
            fd = os.open(name, flags, 0o644, dir_fd=folder)  # no path to build or walk
            try:
                os.write(fd, blob)  # a few hundred bytes: one write
                if created is not None and isinstance(item, Encoded):
                    created.wrote(name, fd, item.name, blob)
            finally:
                os.close(fd)
    finally:
        os.close(folder)
    write_edges(paths, edges, durable=False)
    return count
