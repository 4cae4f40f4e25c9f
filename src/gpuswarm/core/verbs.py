"""A person's queue verbs as typed requests: one :class:`Kind` each, one request model each.

``gpuswarm add | cancel | retry | requeue | pause | unpause | priority`` (the CLI) and the
dashboard's actions build one of these; ``gpuswarm.app.control.execute`` hands it to the one
handler its kind has (``app.control.HANDLERS``, a test checks it covers every kind) under the
run's control lock. A new verb is a kind here, its request, its handler and its command.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypedDict

from gpuswarm.core.taskdump import TaskDump


class Kind(str, Enum):
    """The verbs; the value is the command's name (``cli.py`` lists the commands by it)."""

    ADD = "add"
    CANCEL = "cancel"
    RETRY = "retry"
    REQUEUE = "requeue"
    PAUSE = "pause"
    UNPAUSE = "unpause"
    PRIORITY = "priority"


class Prerequisites(TypedDict, total=False):
    """Issue 35: what ``gpuswarm add --after/--after-any/--after-failed`` give every task."""

    after: tuple[str, ...]
    after_any: tuple[str, ...]
    after_failed: tuple[str, ...]


@dataclass(frozen=True)
class Add:
    """Append tasks (their dumps, as ``config.commands.task_dumps`` gives them)."""

    tasks: tuple[TaskDump, ...]
    source: str  # the file they came from ("<stdin>"), journaled in ``added``
    # issue 35: prerequisites every added task gets (``--after`` & co.; ids or name prefixes):
    # a task with any waits in blocked/
    after: tuple[str, ...] = ()
    after_any: tuple[str, ...] = ()
    after_failed: tuple[str, ...] = ()
    kind: Kind = Kind.ADD


@dataclass(frozen=True)
class Cancel:
    """Cancel tasks: pending ones now, running ones by a request their supervisor applies."""

    tasks: tuple[str, ...]  # ids or unambiguous name prefixes
    reason: str
    wait: float | None = None  # seconds to wait until they left running/ (None: do not)
    group: str | None = None  # issue 35: its pending, blocked and running tasks too
    kind: Kind = Kind.CANCEL


@dataclass(frozen=True)
class Retry:
    """Failed / cancelled tasks back to pending with a fresh attempt budget."""

    tasks: tuple[str, ...]
    failed: bool = False  # every failed task too
    cancelled: bool = False  # every cancelled task too
    group: str | None = None  # issue 35: only this group's failed / cancelled ones
    kind: Kind = Kind.RETRY


@dataclass(frozen=True)
class Requeue:
    """Ended tasks (done, failed, cancelled, skipped) back to pending as a fresh attempt
    series: a fresh budget, no reason and no result; their earlier attempts kept."""

    tasks: tuple[str, ...]
    kind: Kind = Kind.REQUEUE


@dataclass(frozen=True)
class Pause:
    """Claim nothing on the run (``slot`` None), on one slot or of one group; running tasks
    go on."""

    slot: str | None = None
    group: str | None = None  # issue 35: this group's tasks start no more
    kind: Kind = Kind.PAUSE


@dataclass(frozen=True)
class Unpause:
    """Lift a pause of the run, of one slot or of one group."""

    slot: str | None = None
    group: str | None = None  # issue 35: lift a group's pause
    kind: Kind = Kind.UNPAUSE


@dataclass(frozen=True)
class Priority:
    """A pending task's new priority (higher runs first)."""

    task: str
    priority: int
    kind: Kind = Kind.PRIORITY


Verb = Add | Cancel | Retry | Requeue | Pause | Unpause | Priority
