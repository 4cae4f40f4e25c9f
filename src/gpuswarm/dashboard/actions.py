"""The dashboard's buttons: queue control's own functions (``app.control``), the same ones
``gpuswarm cancel | retry | pause | unpause | priority | add`` call, with the same checks and
journal events. A request's body is JSON; a bad one is :class:`BadActionError` (HTTP 400) naming
the field, as the CLI's exit 2 names the flag.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, get_args

from gpuswarm.app.control import (
    add_tasks,
    cancel_tasks,
    retry_tasks,
    set_paused,
    set_priority,
)
from gpuswarm.app.replies import (
    AddReply,
    CancelReply,
    PauseReply,
    PriorityReply,
    Reply,
    RetryReply,
)
from gpuswarm.config.load import load_command_list
from gpuswarm.config.models import TaskOptions
from gpuswarm.core.errors import BadInputError

if TYPE_CHECKING:
    from gpuswarm.dashboard.runhub import RunHub

REASON = "cancelled from the dashboard"
MAX_TASKS = 1000  # tasks one request names at most
MAX_ADD_BYTES = 1 << 20


class BadActionError(BadInputError):
    """An action's request is malformed (a missing or mistyped field)."""


Key = Literal[
    "tasks",
    "failed",
    "cancelled",
    "slot",
    "task",
    "priority",
    "commands",
    "timeout",
    "max_attempts",
    "shell",
]


class ActionBody(TypedDict, total=False):
    """An action's request body: the keys the actions read, each as the client sent it (its
    type checked where it is read, naming the field)."""

    tasks: object
    failed: object
    cancelled: object
    slot: object
    task: object
    priority: object
    commands: object
    timeout: object
    max_attempts: object
    shell: object


def action_body(raw: dict[Any, Any]) -> ActionBody:
    """The body of a request parsed as a JSON object: the keys an action reads (others ignored,
    as they were)."""
    body: ActionBody = {}
    keys: tuple[Key, ...] = get_args(Key)
    for key in keys:
        if key in raw:
            body[key] = raw[key]
    return body


def _tasks(body: ActionBody, *, required: bool = True) -> list[str]:
    tasks = body.get("tasks", [])
    if not isinstance(tasks, list) or not all(isinstance(t, str) and t for t in tasks):
        raise BadActionError("tasks: give a list of task ids")
    if required and not tasks:
        raise BadActionError("tasks: name at least one task")
    if len(tasks) > MAX_TASKS:
        raise BadActionError(f"tasks: at most {MAX_TASKS} at once")
    return tasks


def _slot(body: ActionBody) -> str | None:
    slot = body.get("slot")
    if slot is not None and (not isinstance(slot, str) or not slot):
        raise BadActionError("slot: give a slot id as the run page shows it, or leave it out")
    return slot


def _int(
    body: ActionBody, key: Literal["priority", "max_attempts"], *, required: bool = False
) -> int | None:
    value = body.get(key)
    if value is None or value == "":
        if required:
            raise BadActionError(f"{key}: give a whole number")
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise BadActionError(f"{key}: give a whole number")
    try:
        return int(value)
    except ValueError:
        raise BadActionError(f"{key}: {value!r} is not a whole number") from None


def cancel(run: Path, base_dir: Path, body: ActionBody) -> CancelReply:
    return cancel_tasks(run, _tasks(body), reason=REASON, wait=None)


def retry(run: Path, base_dir: Path, body: ActionBody) -> RetryReply:
    failed = body.get("failed") is True
    cancelled = body.get("cancelled") is True
    tasks = _tasks(body, required=not (failed or cancelled))
    return retry_tasks(run, tasks, failed=failed, cancelled=cancelled)


def pause(run: Path, base_dir: Path, body: ActionBody) -> PauseReply:
    return set_paused(run, _slot(body), paused=True)


def unpause(run: Path, base_dir: Path, body: ActionBody) -> PauseReply:
    return set_paused(run, _slot(body), paused=False)


def priority(run: Path, base_dir: Path, body: ActionBody) -> PriorityReply:
    task = body.get("task")
    if not isinstance(task, str) or not task:
        raise BadActionError("task: give the task's id")
    value = _int(body, "priority", required=True)
    assert value is not None
    return set_priority(run, task, value)


def add(run: Path, base_dir: Path, body: ActionBody) -> AddReply:
    """A command list (one command per line, as ``gpuswarm add RUN LIST``), relative paths
    from the run's base folder; each line run by ``/bin/sh -c`` unless ``shell`` is false."""
    text = body.get("commands")
    if not isinstance(text, str) or not text.strip():
        raise BadActionError("commands: give one command per line")
    if len(text.encode()) > MAX_ADD_BYTES:
        raise BadActionError(f"commands: at most {MAX_ADD_BYTES >> 10} KiB at once")
    timeout = body.get("timeout") or None
    if timeout is not None and not isinstance(timeout, str | int | float):
        raise BadActionError("timeout: give a duration such as 90s, 10m or 2h")
    defaults = TaskOptions.from_cli(
        timeout=timeout,
        max_attempts=_int(body, "max_attempts"),
        priority=_int(body, "priority"),
    )
    shell = body.get("shell", True)  # like a command list on the command line (issue 28)
    if not isinstance(shell, bool):
        raise BadActionError("shell: true (run each line with /bin/sh -c) or false")
    loaded = load_command_list(None, text, shell=shell, base_dir=base_dir, defaults=defaults)
    return add_tasks(run, loaded)


Action = Callable[[Path, Path, ActionBody], Reply]

ACTIONS: dict[str, Action] = {
    "cancel": cancel,
    "retry": retry,
    "pause": pause,
    "unpause": unpause,
    "priority": priority,
    "add": add,
}


def call(action: Action, hub: RunHub, raw: dict[Any, Any]) -> Reply:
    """``action`` on ``hub``'s run with a request's parsed JSON object (relative task paths
    start at run.json's ``base_dir``; none: the run folder)."""
    run = hub.paths.root
    return action(run, Path(str(hub.info.get("base_dir") or run)), action_body(raw))
