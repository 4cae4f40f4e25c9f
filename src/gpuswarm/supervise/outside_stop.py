"""An attempt killed by a stop signal from outside, as its supervisor is stopped too.

Whoever stops a whole job at once (Slurm's ``scancel``, a container or unit stop, ``kill`` of a
process group) signals the task's processes and their supervisor together; a task may die of
that SIGTERM before its supervisor's handler has registered the stop. Such an end (the attempt
died of SIGTERM, SIGINT or SIGHUP, which no part of gpuswarm sent it: no stop, cancel, timeout or
stall of ours) is held for at most :data:`HOLD_SECONDS` (only when the supervisor is not
stopping already: then it is the stop's at once): when the supervisor's own stop arrives
meanwhile, the attempt was interrupted by that stop, like any a warm stop ends (back in
pending/, not counted against ``max_attempts``); otherwise it is judged as it ended (a task that
kills itself with SIGTERM fails, ``killed by SIGTERM``). The hold runs in a waiter thread: the
loop never waits, other slots go on.
"""

from __future__ import annotations

import dataclasses
import threading

from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd
from gpuswarm.supervise.context import LiveAttempt

OUTSIDE_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})  # what a stop from outside sends
HOLD_SECONDS = 1.0  # how long such an end waits for the supervisor's own stop


def from_outside(live: LiveAttempt, end: AttemptEnd) -> bool:
    """Whether the attempt died of a stop signal gpuswarm did not send it."""
    if end.kind is not EndKind.SIGNALED or end.signal not in OUTSIDE_SIGNALS:
        return False  # a timeout, a cancel or a stall of ours ends with another kind
    return not live.handle.cancelled and live.stopped_by is None and live.stalled is None


def ended(live: LiveAttempt, stopping: threading.Event) -> AttemptEnd:
    """The attempt's end (blocking: a waiter's), or the stop's interruption of it when the
    supervisor's stop came (or comes within :data:`HOLD_SECONDS`) with a stop signal from
    outside that killed it."""
    end = live.handle.wait()
    if not from_outside(live, end):
        return end
    if not stopping.wait(HOLD_SECONDS):
        return end  # no stop came: the task's own death (or a signal for it alone)
    why = f"cancelled ({end.signal} from outside, with the stop)"
    return dataclasses.replace(end, kind=EndKind.CANCELLED, reason=why)
