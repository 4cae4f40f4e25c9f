"""Queue verbs on a group (issue 35): ``cancel --group``, ``retry --group [--failed]
[--cancelled]``, ``pause --group`` / ``unpause --group``.

cancel and retry (``verbs.Cancel.group``, ``verbs.Retry.group``) pick the group's tasks (by
their descriptors' ``group``) in the states the verb applies to and give them to the verb's
handler as task arguments (:func:`named`, called by ``app.control.execute``), so each one is
applied, journaled and printed as a named task would be. A group's pause
(``verbs.Pause.group``) is a flag file (``.parallel/groups-paused/<group>``): supervisors
claim none of its tasks while it is there (``supervise/groups.py``, the claim's gate), running
ones go on; an unpause touches the ``added`` marker so their loops claim again.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from gpuswarm.app.replies import PauseReply
from gpuswarm.core import verbs
from gpuswarm.core.errors import BadInputError
from gpuswarm.core.fsutil import atomic_write_bytes
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.queuebase import note_added

CANCELLABLE = (State.PENDING, State.RUNNING, State.BLOCKED)
AnyVerb = TypeVar("AnyVerb", bound=verbs.Verb)


def named(paths: RunPaths, req: AnyVerb) -> AnyVerb:
    """A Cancel or Retry with its ``group``'s tasks among its task arguments (cancel: the
    pending, blocked and running ones; retry: the failed and/or cancelled ones, and then no
    other); any other request as it is."""
    if not isinstance(req, verbs.Cancel | verbs.Retry) or req.group is None:
        return req
    if isinstance(req, verbs.Cancel):
        picked: list[str] = group_tasks(paths, req.group, CANCELLABLE)
        return replace(req, tasks=tuple(dict.fromkeys((*req.tasks, *picked))), group=None)
    found: list[str] = group_tasks(paths, req.group, retry_states(req.failed, req.cancelled))
    tasks = tuple(dict.fromkeys((*req.tasks, *found)))
    return replace(req, tasks=tasks, failed=False, cancelled=False, group=None)


def group_tasks(paths: RunPaths, group: str, states: tuple[State, ...]) -> list[str]:
    """The ids of ``group``'s tasks in ``states``; BadInputError (exit 2) when the run has no
    task of that group at all."""
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


def set_group_paused(paths: RunPaths, group: str, *, paused: bool) -> PauseReply:
    """Pause (or unpause) ``group``: its pending tasks start no more; running ones go on."""
    group_tasks(paths, group, ())  # exit 2 for a group the run does not have
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
