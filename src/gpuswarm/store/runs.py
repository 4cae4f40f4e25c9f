"""Creating and opening run directories (recovering them: :mod:`gpuswarm.supervise.recovery`).

A run is staged in a hidden sibling folder and made visible by one rename once every descriptor
and run.json are on disk, so a bad input or a crash during creation never leaves half a run.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuswarm import __version__
from gpuswarm.core.errors import RunDirError
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import (
    atomic_write_json,
    fsync_dir,
    pid_alive,
    read_json,
    sync_tree,
    temp_writer_alive,
)
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import STATES, RunPaths, find_runs, run_dir_name, slugify
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.store import runindex
from gpuswarm.store.blocked import Edge, write_blocked, write_edges
from gpuswarm.store.created import Created
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import descriptor_name, task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.spool import write_rows_spool, write_spool
from gpuswarm.store.staging import (
    Encoded,
    Templated,
    create_layout,
    encoded,
    write_pending,
    write_skipped,
)


@dataclass(frozen=True)
class NewRun:
    name: str
    workspace: Path
    info: dict[str, Any]  # the run.json content, secrets already redacted
    # TaskSpec dumps (or their descriptors already encoded), in submission order (read once)
    tasks: Iterable[TaskDump | dict[str, Any] | Encoded]  # a partial dict: a test's
    # a streamed enqueue (store/spool.py): the first ``stream_after`` tasks in pending/, the
    # others in the spool, moved into pending/ by the run's supervisor while it runs
    stream_after: int | None = None
    # what this process wrote, remembered for the end-of-run outputs (store/created.py)
    created: Created | None = None


def create_run(new: NewRun, *, suffix: str | None = None, now: datetime | None = None) -> RunPaths:
    """Stage the run (descriptors, run.json), sync once, then rename it into place."""
    parent = new.workspace / slugify(new.name)
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(parent)
    now = now or datetime.now()
    final = _free_name(parent, run_dir_name(now, suffix))
    staging = RunPaths(parent / f".staging-{final.name}-{os.getpid()}")
    try:  # the mkdir inside: a stop signal right after it must not leave the folder behind
        staging.root.mkdir(mode=0o700)  # private: logs, commands and results are the user's
        create_layout(staging)
        staging.tasks.mkdir()
        count = _write_tasks(staging, new)
        info = {**new.info, "run_dir": final.name, "created": now.isoformat(timespec="seconds")}
        atomic_write_json(staging.run_json, info, durable=False)
        staging.events.touch()
        sync_tree(staging.root)
        final = _rename_into_place(staging, final, info)
        fsync_dir(parent)
    except BaseException:
        _remove_tree(staging.root)
        raise
    paths = RunPaths(final)
    runindex.record(final.resolve(), str(new.info.get("name") or new.name))  # found from anywhere
    ledger = Ledger(paths.events)
    ledger.emit(Ev.RUN_CREATED, tasks=count, name=new.name, version=__version__)
    for name in DirQueue(paths).names(State.SKIPPED):  # excluded tasks: journaled as ended
        ledger.emit(
            Ev.FINISHED,
            task=task_id_of(name),
            attempt=0,
            slot="",
            state=State.SKIPPED.value,
            reason="excluded by the config",
            seconds=0,
            retry=False,
        )
    ledger.close()
    return paths


def _write_tasks(staging: RunPaths, new: NewRun) -> int:
    """Every task into the staged run: pending/ (skipped/), the spool after ``stream_after``."""
    try:
        return _write_all(staging, new)
    finally:
        if isinstance(new.tasks, Templated):
            new.tasks.let_go()  # read once, as any iterator of tasks


def _write_all(staging: RunPaths, new: NewRun) -> int:
    items = map(_descriptor, itertools.count(), new.tasks)
    created = new.created
    if new.stream_after is None:
        return write_pending(staging, items, created)
    count = write_pending(staging, itertools.islice(items, new.stream_after), created)
    if isinstance(new.tasks, Templated):  # a command list's: its template and rows
        spooled = write_rows_spool(staging, new.tasks, new.stream_after, created)
        if created is not None:
            created.spool_lines = spooled
        if not spooled:
            staging.enqueue_spool.unlink()
        return count + spooled
    skipped = 0
    edges: list[Edge] = []

    def rest() -> Iterator[tuple[str, bytes]]:
        nonlocal skipped
        for item in items:
            if (  # issue 35: a task with prerequisites goes to blocked/, never the spool
                not isinstance(item, Encoded)
                and item.has_prerequisites
                and item.state != State.SKIPPED.value
            ):
                name = descriptor_name(item.priority, item.seq, item.id)
                skipped += write_blocked(staging, item, name, edges)
                continue
            name, blob, excluded = encoded(item)
            if excluded:
                write_skipped(staging, name, blob)
                skipped += 1
            else:
                if created is not None and isinstance(item, Encoded):
                    created.spooled(name, item.name, blob)
                yield name, blob

    spooled = write_spool(staging, rest())
    if created is not None:
        created.spool_lines = spooled
    write_edges(staging, edges, durable=False)  # synced with the staged run
    if not spooled:
        staging.enqueue_spool.unlink()
    return count + spooled + skipped


def _descriptor(seq: int, task: TaskDump | dict[str, Any] | Encoded) -> Descriptor | Encoded:
    """The ``seq``-th task's pending (or skipped) descriptor."""
    if isinstance(task, Encoded):
        if task.seq != seq:
            raise ValueError(f"encoded task {task.task_id} has seq {task.seq}, not {seq}")
        return task
    return _skipped_if_excluded(Descriptor.new(task, seq))


def _skipped_if_excluded(desc: Descriptor) -> Descriptor:
    """A task an ``exclude:`` glob matched is created skipped: listed, never run."""
    why = desc.skip_reason
    if why:
        desc.mark_skipped(why)
    return desc


def _remove_stale_staging(parent: Path) -> None:
    """Remove staging folders whose creator died (SIGKILL mid-creation): never a visible run."""
    for entry in parent.glob(".staging-run_*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            _remove_tree(entry)


def _rename_into_place(staging: RunPaths, final: Path, info: dict[str, Any]) -> Path:
    """Rename the staged run to ``final``, or, when another run of the same name took that
    name meanwhile (started in the same second), to the next free one: each gets its own."""
    base = final.name
    for _ in range(1000):
        try:
            os.rename(staging.root, final)
            return final
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        final = _free_name(final.parent, base)
        info["run_dir"] = final.name
        atomic_write_json(staging.run_json, info)
    raise OSError(errno.EEXIST, "no free run folder name", str(final))


def _free_name(parent: Path, name: str) -> Path:
    candidate = parent / name
    n = 2
    while candidate.exists():
        candidate = parent / f"{name}-{n}"
        n += 1
    return candidate


def _remove_tree(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def open_record(run_dir: Path) -> tuple[RunPaths, RunRecord]:
    """The run's paths and its run.json read back (:class:`RunRecord`), or RunDirError naming
    what is wrong. ``run_dir`` may be a path inside the run or a name (as :func:`open_run`)."""
    paths, info = open_run(run_dir)
    return paths, RunRecord.from_json(info, str(paths.run_json))


def write_record(paths: RunPaths, record: RunRecord) -> None:
    """run.json rewritten (a resume's new config, raised budget, moved backend)."""
    atomic_write_json(paths.run_json, record.to_json())


def open_run(run_dir: Path) -> tuple[RunPaths, dict[str, Any]]:
    """The run's paths and its raw run.json (the one place it is parsed off disk; typed:
    :func:`open_record`), or RunDirError naming what is wrong. ``run_dir`` may be a path inside
    the run or a name (./runs, then the index of the user's runs)."""
    paths = RunPaths(runindex.resolve(run_dir).resolve()).require_run()
    try:
        info = read_json(paths.run_json)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{paths.run_json}: unreadable run snapshot ({exc})") from None
    if not isinstance(info, dict):
        raise RunDirError(f"{paths.run_json}: not a JSON object")
    return paths, info


def latest_run(workspace: Path, name: str | None = None) -> Path:
    runs = find_runs(workspace)
    if name is not None:
        runs = [r for r in runs if r.parent.name == slugify(name)]
    if not runs:
        what = f"named {name!r} " if name else ""
        raise RunDirError(
            f"no run {what}found under {workspace}; pass the run folder, or --workspace"
        )
    return max(runs, key=lambda r: (r.name, r.stat().st_mtime))


def set_aside(queue: DirQueue, ledger: Ledger, path: Path, reason: str) -> None:
    """Move an unreadable descriptor to corrupt/ and journal it."""
    queue.quarantine(path, reason)
    ledger.emit(Ev.CORRUPT, task=task_id_of(path.name), file=path.name, reason=reason)


def temp_files(paths: RunPaths) -> list[Path]:
    """Temp files in the state folders that a crash cut short (descriptors stay intact).

    A temp file whose writer is still alive is a write in progress, not a leftover: a process
    that adds tasks to a run it does not lock (``research try`` beside its runner) may be
    between its write and its rename, and removing the file would fail that rename.
    """
    found = []
    for state in STATES:
        try:
            names = os.listdir(paths.state_dir(state))
        except FileNotFoundError:  # cancelled/ of a run made before it existed
            continue
        found += [
            paths.state_dir(state) / name
            for name in names
            if name.startswith((".tmp-", ".retry-")) and not temp_writer_alive(name)
        ]
    return found
