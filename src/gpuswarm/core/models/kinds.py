"""The str Enums of the records (queue states, attempt end kinds) and the error a record read back
from disk raises when it is unusable."""

from __future__ import annotations

from enum import Enum

from gpuswarm.core.errors import QueueError

DESCRIPTOR_VERSION = 1


class State(str, Enum):
    """The queue folder a descriptor is in (and the ``state`` it records)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    SKIPPED = "skipped"  # ended without counting as a failure (skip_exit_code, exclude:)
    CANCELLED = "cancelled"  # a person cancelled it (gpuswarm cancel): never retried, no failure

    def is_terminal(self) -> bool:
        """Whether a task in this state has ended: it runs no attempt and will run none unless
        it is retried. Every state but pending and running (done, failed, skipped, cancelled,
        and any state of an ended task added later; a new state of a task that has still to
        run joins pending and running here): the one rule for "ended"."""
        return self not in (State.PENDING, State.RUNNING)

    @classmethod
    def terminal(cls) -> tuple[State, ...]:
        """The ended states, in folder order (done, failed, skipped, cancelled)."""
        return tuple(s for s in cls if s.is_terminal())


class EndKind(str, Enum):
    """How an attempt ended (an attempt record's ``kind``)."""

    EXITED = "exited"
    SIGNALED = "signaled"
    TIMEOUT = "timeout"
    NOT_FOUND = "not-found"
    NOT_EXECUTABLE = "not-executable"
    CANCELLED = "cancelled"
    SPAWN_ERROR = "spawn-error"
    LOST = "lost"  # its supervisor died: the outcome is unknown
    ORPHAN = "orphan"  # its supervisor died, judged done by the completion file it left
    STALLED = "stalled"  # issue 34: no output, CPU or GPU activity for stall_after: stopped


class RecordError(QueueError, ValueError):
    """A record read back from disk is unusable; the message is the finding (``check``, the
    corrupt row of results) naming the field at fault."""
