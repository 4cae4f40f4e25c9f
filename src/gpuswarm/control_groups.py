"""Queue verbs on a group (issue 35): ``cancel --group``, ``retry --group [--failed]
[--cancelled]``, ``pause --group`` / ``unpause --group``.

cancel and retry pick the group's tasks (by their descriptors' ``group``) in the states the verb
applies to and hand them to :mod:`.control_ops` as task arguments, so each one is applied,
journaled and printed as a named task would be. A group's pause is a flag file
(``.parallel/groups-paused/<group>``): supervisors claim none of its tasks while it is there
(``supervise/groups.py``, the claim's gate), running ones go on; an unpause touches the
``added`` marker so their loops claim again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuswarm.core.errors import BadInputError
from gpuswarm.core.fsutil import atomic_write_bytes
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.queue import note_added
from gpuswarm.store.runs import open_run

CANCELLABLE = (State.PENDING, State.RUNNING, State.BLOCKED)


def group_tasks(run_dir: Path, group: str, states: tuple[State, ...]) -> list[str]:
    """The ids of ``group``'s tasks in ``states``; BadInputError (exit 2) when the run has no
    task of that group at all."""
    paths, _ = open_run(run_dir)
    folders = QueueFolders(paths)
    found = False
    out: list[str] = []
    for state in State:
        for _, desc in folders.iter_descs(state):
            if desc.group != group:
                continue
            found = True
            if state in states:
                out.append(desc.id)
    if not found:
        raise BadInputError(f"no task of group {group!r} in {paths.root}")
    return out


def retry_states(failed: bool, cancelled: bool) -> tuple[State, ...]:
    if not (failed or cancelled):
        raise BadInputError("retry --group: add --failed and/or --cancelled (which tasks)")
    return (State.FAILED,) * failed + (State.CANCELLED,) * cancelled


def set_group_paused(run_dir: Path, group: str, *, paused: bool) -> dict[str, Any]:
    """Pause (or unpause) ``group``: its pending tasks start no more; running ones go on."""
    group_tasks(run_dir, group, ())  # exit 2 for a group the run does not have
    paths, _ = open_run(run_dir)
    flag = _flag(paths, group)
    was = flag.exists()
    if paused and not was:
        flag.parent.mkdir(exist_ok=True)
        atomic_write_bytes(flag, b"paused\n")
    elif not paused and was:
        flag.unlink(missing_ok=True)
        note_added(paths)  # live supervisors' loops claim its tasks again
    return {"run": str(paths.root), "group": group, "paused": paused, "changed": was != paused}


def _flag(paths: RunPaths, group: str) -> Path:
    return paths.paused_groups / group  # a group name is a plain name (config checks it)
