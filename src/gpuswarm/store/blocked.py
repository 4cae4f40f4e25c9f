"""Tasks waiting for their prerequisites (issue 35): ``blocked/``, the edges, the end marks.

A task with ``after:``, ``after_any:`` or ``after_failed:`` is created (or added) in
``blocked/``, out of the claimers' sight: the claim path never sees, reads or skips it. Its
edges are one line of ``.parallel/edges.jsonl``, written before the task becomes visible
(staged with the run, or appended and synced by ``gpuswarm add`` before its renames): every
supervisor reads that file once, then only its new lines, into a reverse index (prerequisite ->
dependents), so releasing the dependents of an ended task costs O(its dependents), never a scan.

Whoever commits a prerequisite's end (the committer, a cancel, recovery) first writes its end
mark (``.parallel/ended/<id>``: the state), then settles each dependent: one whose conditions
are met leaves blocked/. Every such move (:meth:`BlockedFolder.settle`) takes the file by a
rename (``blocked/.settle-<pid>-<name>``: two settlers, or a settle and a cancel, cannot both
win), saves the new state in it, journals, then renames it into its new folder. A crash between
the steps leaves the aside file of a dead pid: :meth:`BlockedFolder.finish_cut` finishes it when
it was saved (journaled again, like every finished move) and puts it back otherwise; recovery
then settles every blocked task again from the folders (``store.release.settle_all``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuswarm.core import faults
from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact, pid_alive
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.folders import QueueFolders

SETTLE = ".settle-"  # blocked/.settle-<pid>-<name>: a move out of blocked/ under way
_ENDED_VALUES = frozenset(s.value for s in State.terminal())  # an end mark's words
FAILED_ENDS = frozenset({State.FAILED.value, State.DEPENDENCY_FAILED.value})
Announce = Callable[[Descriptor], object]


@dataclass(frozen=True, slots=True)
class Edge:
    """One dependent: its id, its file name in blocked/, and its prerequisites."""

    task: str
    name: str
    after: tuple[str, ...] = ()
    after_any: tuple[str, ...] = ()
    after_failed: tuple[str, ...] = ()

    def prerequisites(self) -> set[str]:
        return {*self.after, *self.after_any, *self.after_failed}

    def line(self) -> bytes:
        return dumps_compact(
            {
                "task": self.task,
                "name": self.name,
                "after": list(self.after),
                "after_any": list(self.after_any),
                "after_failed": list(self.after_failed),
            }
        )

    @classmethod
    def of(cls, desc: Descriptor, name: str) -> Edge:
        return cls(
            desc.id, name, tuple(desc.after), tuple(desc.after_any), tuple(desc.after_failed)
        )

    @classmethod
    def parse(cls, line: bytes) -> Edge | None:
        try:
            obj = json.loads(line)
            return cls(
                str(obj["task"]),
                str(obj["name"]),
                tuple(str(t) for t in obj.get("after") or ()),
                tuple(str(t) for t in obj.get("after_any") or ()),
                tuple(str(t) for t in obj.get("after_failed") or ()),
            )
        except (ValueError, KeyError, TypeError):
            return None  # a torn last line (a crash cut an add short): its task is not visible


def verdict(edge: Edge, state_of: Callable[[str], str | None]) -> tuple[State | None, str]:
    """Where a blocked task goes now: (None, "") while it waits; PENDING once its conditions
    are met; DEPENDENCY_FAILED at once when an ``after:`` prerequisite ended other than done;
    SKIPPED when its ``after_failed:`` prerequisites all ended and none failed."""
    waiting = False
    for pre in edge.after:
        st = state_of(pre)
        if st is None:
            waiting = True
        elif st != State.DONE.value:
            return State.DEPENDENCY_FAILED, f"prerequisite {pre} ended {st}"
    any_failed, all_ended = False, True
    for pre in edge.after_failed:
        st = state_of(pre)
        if st is None:
            all_ended = False
        elif st in FAILED_ENDS:
            any_failed = True
    if edge.after_failed and all_ended and not any_failed:
        shown = ", ".join(edge.after_failed)
        return State.SKIPPED, f"after_failed: none of {shown} failed"
    waiting = waiting or not all_ended or any(state_of(p) is None for p in edge.after_any)
    return (None, "") if waiting else (State.PENDING, "")


# -- the edges file and the reverse index -------------------------------------------------------
def write_edges(paths: RunPaths, edges: Iterable[Edge], *, durable: bool = True) -> int:
    """Append edge lines (one write; fsync'd when ``durable``) before their tasks are visible."""
    data = b"".join(e.line() for e in edges)
    if not data:
        return 0
    fd = os.open(paths.edges, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    return data.count(b"\n")


class EdgeIndex:
    """prerequisite -> dependents, read from edges.jsonl: all of it once, then its new lines
    (one stat per look)."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self._offset = 0
        self._lock = threading.Lock()
        self.dependents: dict[str, list[Edge]] = {}
        self.edges: dict[str, Edge] = {}

    def refresh(self) -> None:
        with self._lock:
            try:
                size = self.paths.edges.stat().st_size
            except FileNotFoundError:
                return
            if size <= self._offset:
                return
            with self.paths.edges.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read(size - self._offset)
            end = data.rfind(b"\n") + 1  # a line being appended right now: read next time
            self._offset += end
            for line in data[:end].splitlines():
                edge = Edge.parse(line)
                if edge is not None:
                    self._index(edge)

    def _index(self, edge: Edge) -> None:
        old = self.edges.get(edge.task)
        if old is not None:
            for pre in old.prerequisites():
                self.dependents[pre] = [e for e in self.dependents.get(pre, []) if e is not old]
        self.edges[edge.task] = edge
        for pre in edge.prerequisites():
            self.dependents.setdefault(pre, []).append(edge)

    def of(self, prerequisite: str) -> list[Edge]:
        self.refresh()
        return list(self.dependents.get(prerequisite, ()))

    def edge(self, task: str) -> Edge | None:
        self.refresh()
        return self.edges.get(task)


def write_blocked(paths: RunPaths, desc: Descriptor, name: str, edges: list[Edge]) -> int:
    """A staged (or added, under a temp name) task with prerequisites: written in blocked/,
    its edge collected for :func:`write_edges`."""
    desc.mark_blocked()
    atomic_write_bytes(
        paths.state_dir(State.BLOCKED.value) / name, dumps_compact(desc.raw), durable=False
    )
    edges.append(Edge.of(desc, name))
    return 1


# -- end marks ----------------------------------------------------------------------------------
def mark_ended(paths: RunPaths, task: str, state: State) -> None:
    """``ended/<task>`` says ``state`` (no fsync: a SIGKILL keeps it; after a machine crash
    recovery writes the marks again from the folders)."""
    folder = paths.ended_marks
    try:
        atomic_write_bytes(folder / task, state.value.encode(), durable=False)
    except FileNotFoundError:  # the first mark of the run
        folder.mkdir(exist_ok=True)
        atomic_write_bytes(folder / task, state.value.encode(), durable=False)


def unmark(paths: RunPaths, task: str) -> None:
    """A retried prerequisite has not ended any more."""
    with contextlib.suppress(FileNotFoundError):
        (paths.ended_marks / task).unlink()


def ended_state(paths: RunPaths, task: str) -> str | None:
    try:
        fd = os.open(paths.ended_marks / task, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 64).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    return text if text in _ENDED_VALUES else None


# -- the moves out of blocked/ (and back) -------------------------------------------------------
class BlockedFolder(QueueFolders):
    """The transitions of blocked tasks, each take -> save -> journal -> rename."""

    def __init__(self, paths: RunPaths, *, durable: bool = True) -> None:
        super().__init__(paths)
        self.durable = durable

    def settle(
        self, name: str, to: State, reason: str | None, announce: Announce
    ) -> Descriptor | None:
        """Move blocked ``name`` to ``to`` (pending, dependency_failed, skipped, cancelled);
        None when it is not in blocked/ (another settler, or a cancel, took it).

        A release (to pending) is take, journal, rename: nothing is saved, its descriptor says
        ``blocked`` until it is claimed (a cut release is put back and settled again: the
        verdict is a function of its prerequisites' committed ends). An end saves its state
        and reason first (a cut end is finished from them)."""
        folder = self.paths.state_dir(State.BLOCKED.value)
        aside = folder / f"{SETTLE}{os.getpid()}-{name}"
        try:
            os.rename(folder / name, aside)
        except FileNotFoundError:
            return None
        try:
            desc = Descriptor.loads(aside.read_bytes())
        except (OSError, ValueError):
            os.replace(aside, folder / name)  # left for check to report
            return None
        if to is not State.PENDING:
            desc.raw["state"] = to.value
            desc.raw["reason"] = reason
            atomic_write_bytes(aside, dumps_compact(desc.raw), durable=self.durable)
        faults.point("blocked.settle.saved", state=to.value)
        self._finish(aside, name, desc, to, announce)
        return desc

    def _finish(
        self, aside: os.PathLike[str], name: str, desc: Descriptor, to: State, announce: Announce
    ) -> None:
        announce(desc)
        faults.point("blocked.settle.journaled", state=to.value)
        dst = self.paths.state_dir(to.value)
        try:
            os.rename(aside, dst / name)  # no folder fsync: a lost rename is redone by recovery
        except FileNotFoundError:
            dst.mkdir(exist_ok=True)  # a folder of a run made before it existed
            os.rename(aside, dst / name)

    def finish_cut(self, announce: Callable[[Descriptor, State], object]) -> int:
        """Moves a crash cut short (their pid is dead): an end finished when saved (journaled
        again); a release, or an end not saved, put back into blocked/ (settle_all settles it
        again). Returns how many were finished."""
        folder = self.paths.state_dir(State.BLOCKED.value)
        done = 0
        for entry in _listdir(folder):
            pid, _, name = entry[len(SETTLE) :].partition("-")
            if not entry.startswith(SETTLE) or not pid.isdigit() or not name:
                continue
            if int(pid) != os.getpid() and pid_alive(int(pid)):
                continue
            aside = folder / entry
            try:
                desc = Descriptor.loads(aside.read_bytes())
                to = State(desc.state)
            except (OSError, ValueError):
                os.replace(aside, folder / name)
                continue
            if to in (State.BLOCKED, State.PENDING):
                os.replace(aside, folder / name)  # an end not saved, or a release: settled
                continue  # again by the caller (settle_all), journaled again
            self._finish(aside, name, desc, to, functools.partial(_to, announce, to))
            done += 1
        return done

    def block_again(
        self,
        state: State,
        name: str,
        announce: Announce,
        prepare: Callable[[Descriptor], object] | None = None,
    ) -> Descriptor | None:
        """A dependency_failed (or skipped) task back to blocked/ (its prerequisite was
        retried), or an ended one a retry or requeue brings back before its prerequisites
        ended (``prepare``: its fresh budget): saved in place, ``announce``, renamed. None
        when unreadable or gone."""
        src = self.paths.state_dir(state.value) / name
        desc = self.read_desc(state, name)
        if desc is None:
            return None
        if prepare is not None:
            prepare(desc)
        desc.mark_blocked()
        staged = src.parent / f".retry-{name}"
        atomic_write_bytes(staged, dumps_compact(desc.raw), durable=self.durable)
        os.replace(staged, src)
        announce(desc)
        try:
            os.rename(src, self.paths.state_dir(State.BLOCKED.value) / name)
        except FileNotFoundError:
            return None
        return desc

    def block_pending(self, name: str, desc: Descriptor, announce: Announce) -> None:
        """A pending task whose prerequisites have not all ended back to blocked/ (recovery's:
        no claimer runs meanwhile): ``announce``, renamed, its state saved there."""
        announce(desc)
        blocked = self.paths.state_dir(State.BLOCKED.value) / name
        os.rename(self.paths.state_dir(State.PENDING.value) / name, blocked)
        desc.mark_blocked()
        atomic_write_bytes(blocked, dumps_compact(desc.raw), durable=self.durable)


def _to(announce: Callable[[Descriptor, State], object], to: State, desc: Descriptor) -> object:
    return announce(desc, to)


def _listdir(folder: os.PathLike[str]) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []
