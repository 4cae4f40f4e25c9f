"""The queue folders of a run being created, before the rename that makes it visible.

Nobody else can see a staged run, so its descriptors need no lease, no journal line and no
per-file fsync: :func:`gpuswarm.store.runs.create_run` syncs the filesystem once
(:func:`gpuswarm.core.fsutil.sync_tree`) and then renames the whole run into place.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import STATES, RunPaths
from gpuswarm.store.blocked import Edge, write_blocked, write_edges
from gpuswarm.store.names import descriptor_name


def create_layout(paths: RunPaths) -> None:
    """The state folders and corrupt/ under ``.parallel/``."""
    paths.parallel.mkdir(parents=True, exist_ok=True, mode=0o700)
    for state in STATES:
        paths.state_dir(state).mkdir(exist_ok=True)
    paths.corrupt.mkdir(exist_ok=True)


def write_pending(paths: RunPaths, descriptors: Iterable[Descriptor | dict[str, Any]]) -> int:
    """Write descriptors into ``pending/`` (``skipped/`` for excluded ones) of a staged run.

    No per-file fsync: the caller syncs the filesystem once before it makes the staged run
    visible with a rename, so 100k tasks cost one sync, not 100k.
    """
    count = 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    folder = os.open(paths.state_dir("pending"), os.O_RDONLY | os.O_DIRECTORY)
    skipped = paths.state_dir(State.SKIPPED.value)
    edges: list[Edge] = []  # issue 35: tasks after prerequisites wait in blocked/
    try:
        for item in descriptors:
            desc = item if isinstance(item, Descriptor) else Descriptor(item)
            name = descriptor_name(desc.priority, desc.seq, desc.id)
            if desc.state == State.SKIPPED.value:  # excluded: never pending
                atomic_write_bytes(skipped / name, dumps_compact(desc.raw), durable=False)
                count += 1
                continue
            if desc.has_prerequisites:
                count += write_blocked(paths, desc, name, edges)
                continue
            fd = os.open(name, flags, 0o644, dir_fd=folder)  # no path to build or walk
            try:
                os.write(fd, dumps_compact(desc.raw))  # a few hundred bytes: one write
            finally:
                os.close(fd)
            count += 1
    finally:
        os.close(folder)
    write_edges(paths, edges, durable=False)
    return count
