"""A person's batches of queue transitions: ``gpuswarm add``'s batch and ``gpuswarm requeue``,
part of :class:`gpuswarm.store.queue.DirQueue` (this is its mixin, as :mod:`.moves` is for a
claimed descriptor's moves): each save -> journal (the caller's) -> rename, and what a crash cut
short finished by the next control command or resume.

Layout (under ``RunPaths.parallel``)::

    pending/.adding-<pid>.<ns>-<name>    a task an add has written, not shown yet (renamed
                                         into blocked/ when it has prerequisites, issue 35)
    <ended>/.requeue-<pid>-<name>        an ended task a requeue holds a moment
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from gpuswarm.core.events import Ev, kind_of
from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact, fsync_dir, pid_alive, sync_tree
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.ledger import read_events
from gpuswarm.store.names import descriptor_name
from gpuswarm.store.queuebase import Announce, QueueBase

ADDING = ".adding-"  # pending/.adding-<pid>.<ns>-<name>: a task an add has written, not shown
REQUEUING = ".requeue-"  # <ended>/.requeue-<pid>-<name>: a task a requeue holds a moment
# the ended states a requeue takes from: every one but dependency_failed (it never ran: its
# prerequisite is requeued, app/deps.py)
REQUEUABLE = tuple(s for s in State.terminal() if s is not State.DEPENDENCY_FAILED)


class QueueBatches(QueueBase):
    """DirQueue's transitions of a person's batches (see the module's doc)."""

    def add_batch(self, descs: list[Descriptor], journal: Callable[[str], object]) -> list[str]:
        """Add ``descs`` to pending/ as one batch: each written under a hidden name (no fsync
        each), one sync of the folder, ``journal(batch)`` (the ``added`` event, synced: it names
        the batch), then the renames and the ``added`` marker. A crash in between is finished by
        :meth:`finish_adds`. A descriptor saying ``blocked`` (issue 35: it has prerequisites;
        ``journal`` published its edge first) is renamed into blocked/ instead. Returns the
        final names (callers hold control_lock())."""
        batch = f"{os.getpid()}.{time.time_ns()}"
        pending = self.paths.state_dir(State.PENDING.value)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        staged: list[tuple[str, str]] = []  # (temp name, final name)
        into_blocked = {d.id for d in descs if d.state == State.BLOCKED.value}
        folder = os.open(pending, os.O_RDONLY | os.O_DIRECTORY)
        blocked = _open_blocked(self.paths) if into_blocked else None
        try:
            for desc in descs:
                final = descriptor_name(desc.priority, desc.seq, desc.id)
                temp = f"{ADDING}{batch}-{final}"  # invisible until renamed
                fd = os.open(temp, flags, 0o644, dir_fd=folder)
                try:
                    os.write(fd, dumps_compact(desc.raw))
                finally:
                    os.close(fd)
                staged.append((temp, final))
            sync_tree(pending)  # every descriptor's data on disk: one sync, not one per file
            journal(batch)  # the journal says it before the names become visible
            for (temp, final), desc in zip(staged, descs, strict=True):
                into = blocked if blocked is not None and desc.id in into_blocked else folder
                os.rename(temp, final, src_dir_fd=folder, dst_dir_fd=into)
            if blocked is not None:
                os.fsync(blocked)
        finally:
            os.close(folder)
            if blocked is not None:
                os.close(blocked)
        fsync_dir(pending)
        self.note_new_work()
        return [final for _, final in staged]

    def finish_adds(self, journaled: Callable[[], set[str]]) -> int:
        """Adds a crash cut short (their writer is dead): a batch ``journaled()`` names (the
        journal's ``added`` events) is finished, its tasks renamed into pending/; one it does not
        name is removed (the add never said so); one with prerequisites goes into blocked/
        (:func:`added_folder`). Returns how many tasks were added."""
        pending = self.paths.state_dir(State.PENDING.value)
        batches: dict[str, list[str]] = {}
        for name in os.listdir(pending):
            if name.startswith(ADDING):
                batch = name[len(ADDING) :].split("-", 1)[0]
                pid = batch.split(".", 1)[0]
                if pid.isdigit() and (int(pid) == os.getpid() or not pid_alive(int(pid))):
                    batches.setdefault(batch, []).append(name)
        if not batches:
            return 0
        said = journaled()
        added = 0
        for batch, names in batches.items():
            for name in names:
                final = name[len(ADDING) + len(batch) + 1 :]
                into = added_folder(self.paths, pending / name) if batch in said else pending
                if batch in said and not (into / final).exists():
                    os.rename(pending / name, into / final)
                    added += 1
                else:
                    (pending / name).unlink(missing_ok=True)
        fsync_dir(pending)
        if added:
            self.note_new_work()
        return added

    def requeue(self, state: State, name: str, announce: Announce) -> Descriptor | None:
        """An ended task (any ended state, done included) back to pending/ as a fresh attempt
        series: held under a hidden name in its folder, saved there (fresh budget, no reason,
        no result), ``announce`` (journal), renamed into pending/. None when it is unreadable
        or gone. A crash in between is finished by :meth:`finish_requeues`."""
        if state not in REQUEUABLE:
            raise ValueError(f"requeue from {state.value}: only ended tasks")
        folder = self.paths.state_dir(state.value)
        held = folder / f"{REQUEUING}{os.getpid()}-{name}"
        try:
            os.rename(folder / name, held)
        except FileNotFoundError:
            return None
        desc = self.read_desc(state, held.name)
        if desc is None:
            if held.exists():
                os.rename(held, folder / name)  # unreadable: left where it was, for check
            return None
        desc.fresh_budget()
        desc.result = None
        atomic_write_bytes(held, dumps_compact(desc.raw), durable=self.durable)
        announce(desc)
        os.rename(held, self.paths.state_dir(State.PENDING.value) / name)
        self.push(name)
        return desc

    def finish_requeues(self, announce: Callable[[Descriptor, State], object]) -> int:
        """Requeues a crash cut short (their writer is dead): one saved already is announced
        again (the journal never lags behind the folders) and renamed into pending/; one not
        saved yet goes back to its folder as it was. Returns how many were requeued."""
        requeued = 0
        for state in REQUEUABLE:
            folder = self.paths.state_dir(state.value)
            try:
                names = [n for n in os.listdir(folder) if n.startswith(REQUEUING)]
            except FileNotFoundError:
                continue
            for held_name in names:
                pid, _, name = held_name[len(REQUEUING) :].partition("-")
                if not pid.isdigit() or not name:
                    continue
                if pid_alive(int(pid)) and int(pid) != os.getpid():
                    continue
                desc = self.read_desc(state, held_name)
                if desc is not None and desc.state == State.PENDING.value:
                    announce(desc, state)
                    os.rename(folder / held_name, self.paths.state_dir("pending") / name)
                    self.push(name)
                    requeued += 1
                else:
                    os.rename(folder / held_name, folder / name)
        return requeued


def journaled_batches(paths: RunPaths) -> set[str]:
    """The batches the journal's ``added`` events name (:meth:`QueueBatches.finish_adds`'s
    ``journaled``: a cut-short add it names is finished, one it does not is removed)."""
    return {str(e.get("batch")) for e in read_events(paths.events) if kind_of(e) == Ev.ADDED.value}


def _open_blocked(paths: RunPaths) -> int:
    folder = paths.state_dir(State.BLOCKED.value)
    folder.mkdir(exist_ok=True)  # a run made before blocked/ existed
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY)


def added_folder(paths: RunPaths, temp: Path) -> Path:
    """Where a task an add wrote goes (pending/, or blocked/ when its descriptor says
    ``blocked``, issue 35): a cut-short add finished later puts it where it was meant to go."""
    try:
        blocked = Descriptor.loads(temp.read_bytes()).state == State.BLOCKED.value
    except (OSError, ValueError):
        blocked = False
    if not blocked:
        return paths.state_dir(State.PENDING.value)
    out = paths.state_dir(State.BLOCKED.value)
    out.mkdir(exist_ok=True)
    return out
