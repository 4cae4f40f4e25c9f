"""Which tasks of a run a user means: the TASK arguments of ``logs`` and of the control commands
(cancel, retry, priority) resolved against the run's queue folders, read through RunReader.

A TASK is a task id, or an unambiguous prefix of a task id or of a task name. An exact id wins
over everything, then an exact name that only one task has, then the one task whose id or name
starts with it. Anything else is :class:`UnknownTaskError` (exit 2) naming it, with the
candidates when several match. Ids come from the folders' file names (no descriptor read);
descriptors are read only when an argument is no exact id (to match names).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuswarm.core.errors import BadInputError
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.names import task_id_of
from gpuswarm.store.reader import RunReader

MAX_SHOWN = 10  # candidates named in an "ambiguous" message
LISTINGS = 3  # passes over the folders before an argument is unknown (a move can hide a task)


class UnknownTaskError(BadInputError):
    """A TASK argument names no task of the run, or several: the message names it (and them)."""


def task_ended(state: State) -> bool:
    """Whether a task in ``state`` has ended (:meth:`State.is_terminal`, the one rule)."""
    return state.is_terminal()


@dataclass(frozen=True)
class TaskHit:
    """A task found in the queue folders: its id, the state folder it is in, its file there."""

    id: str
    state: State
    file: str


def task_index(reader: RunReader) -> dict[str, TaskHit]:
    """Task id -> where it is, from the state folders' names (pending first: a task seen in two
    folders during a move counts where it was seen first)."""
    out: dict[str, TaskHit] = {}
    for state in State:
        for name in reader.names(state):
            out.setdefault(task_id_of(name), TaskHit(task_id_of(name), state, name))
    return out


def locate(reader: RunReader, task_id: str) -> TaskHit | None:
    """Where the task ``task_id`` is now; None when no folder has it (a move caught in between
    two listings: ask again)."""
    for _ in range(2):
        hit = task_index(reader).get(task_id)
        if hit is not None:
            return hit
    return None


class _Names:
    """Task id -> task name, read from the descriptors once, the first time a name is needed."""

    def __init__(self, reader: RunReader, index: dict[str, TaskHit]) -> None:
        self.reader = reader
        self.index = index
        self._names: dict[str, str] | None = None

    def get(self) -> dict[str, str]:
        if self._names is None:
            self._names = {}
            for hit in self.index.values():
                desc = self.reader.read(hit.state, hit.file)
                if desc is not None and desc.name:
                    self._names[hit.id] = desc.name
        return self._names


def _resolve_one(arg: str, index: dict[str, TaskHit], names: _Names, paths: RunPaths) -> str:
    if not arg:
        raise UnknownTaskError("an empty TASK argument: give a task id or a prefix of one")
    if arg in index:
        return arg
    by_name = names.get()
    exact = [tid for tid, name in by_name.items() if name == arg]
    if len(exact) == 1:
        return exact[0]
    found = sorted(
        {tid for tid in index if tid.startswith(arg)}
        | {tid for tid, name in by_name.items() if name.startswith(arg)}
    )
    if len(found) == 1:
        return found[0]
    if not found:
        raise UnknownTaskError(
            f"no task {arg!r} in {paths.root}: give a task id, or a prefix of a task id or "
            f"name ('gpuswarm status {paths.root}' lists them)"
        )
    shown = ", ".join(
        f"{tid} ({by_name[tid]})" if by_name.get(tid) else tid for tid in found[:MAX_SHOWN]
    )
    more = f" and {len(found) - MAX_SHOWN} more" if len(found) > MAX_SHOWN else ""
    raise UnknownTaskError(
        f"task {arg!r} is ambiguous in {paths.root}: it matches {len(found)} tasks: "
        f"{shown}{more}; give more of the id"
    )


def resolve_tasks(paths: RunPaths, args: Iterable[str]) -> list[str]:
    """The task ids the TASK arguments ``args`` mean (in their order, each once), or
    :class:`UnknownTaskError` naming every argument that is unknown or ambiguous."""
    reader = RunReader(paths)
    wanted = list(args)
    for _ in range(LISTINGS):
        index = task_index(reader)
        names = _Names(reader, index)
        out: list[str] = []
        problems: list[str] = []
        for arg in wanted:
            try:
                tid = _resolve_one(arg, index, names, paths)
            except UnknownTaskError as exc:
                problems.append(str(exc))
                continue
            if tid not in out:
                out.append(tid)
        if not problems:
            return out
        # A task moved back to a folder already listed (running -> pending on a retry) is in
        # no listing of this pass: list again before calling an argument unknown.
    raise UnknownTaskError("; ".join(problems))


def resolve_task(paths: RunPaths, arg: str) -> TaskHit:
    """The one task ``arg`` means, and where it is now."""
    (tid,) = resolve_tasks(paths, [arg])
    hit = locate(RunReader(paths), tid)
    if hit is None:  # it vanished between two listings (withdrawn meanwhile)
        raise UnknownTaskError(f"task {tid!r} is no longer in {paths.root}")
    return hit
