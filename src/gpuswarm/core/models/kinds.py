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
    # issue 35: a task whose prerequisites (after:, after_any:, after_failed:) have not ended
    # waits in blocked/, out of the claimers' sight; one whose ``after:`` prerequisite did not
    # succeed ends dependency_failed (never ran, out of the pass rates, back when it is retried)
    BLOCKED = "blocked"
    DEPENDENCY_FAILED = "dependency_failed"


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


class RecordError(QueueError, ValueError):
    """A record read back from disk is unusable; the message is the finding (``check``, the
    corrupt row of results) naming the field at fault."""
