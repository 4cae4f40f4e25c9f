"""The halt (``halt:`` / ``--halt``, :mod:`gpuswarm.config.halt`): this supervisor's count of
tasks that ended, and the stop it asks for once the rule is met.

What counts: a task that ended failed (no attempt left: a failed attempt that will be retried
is no failed task yet), done, or either (``done=``); skipped and cancelled tasks never count,
nor attempts a stop handed back. Each task counts once (one retried by hand on a live run that
fails again is still one failed task). The count is this supervisor's, from its start: a ``resume``
after a halt counts anew (it retries the failed tasks; a second halt needs as many new ends).
A percentage is of the run's tasks (skipped and cancelled ones left out), the queue's count
taken again at most every few seconds (tasks added to a live run count).

``soon``: the loop claims nothing more, the running attempts end and are committed as usual,
then the supervisor ends (pending tasks wait for a ``resume``). ``now``: the running attempts
are stopped too, through the warm stop a Ctrl-C takes (they go back to the queue, not failed).

The loop asks :meth:`Halt.may_claim` before each claim: outcomes not committed yet might be the
ones that meet the rule, so near the threshold a free slot waits for them (the committer wakes
the loop). At most ``N + slots - 1`` attempts start before a ``fail=N`` halt.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from gpuswarm.config.halt import HaltRule, parse_halt
from gpuswarm.core.events import Ev
from gpuswarm.core.models import State
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue

RECOUNT_SECONDS = 5.0  # a percentage's total: the queue's count taken again this often

_COUNTED = {
    "fail": (State.FAILED,),
    "success": (State.DONE,),
    "done": (State.DONE, State.FAILED),
}


class Halt:
    """The rule and the count (thread-safe: committers and waiter threads call :meth:`ended`)."""

    def __init__(
        self,
        spec: str | None,
        queue: DirQueue,
        ledger: Ledger,
        *,
        on_soon: Callable[[], None],
        on_now: Callable[[str], None],
    ) -> None:
        self.rule: HaltRule | None = parse_halt(spec) if spec else None
        self._queue = queue
        self._ledger = ledger
        self._on_soon = on_soon
        self._on_now = on_now
        self._lock = threading.Lock()
        self._count = 0
        self._counted: set[str] = set()  # tasks counted: one retried by hand counts once
        self._total = 0
        self._counted_at = -RECOUNT_SECONDS
        self.reason: str | None = None  # set once the rule is met: "halt: 3 tasks failed ..."
        if self.rule is not None and self.rule.percent:
            self._recount()

    @property
    def draining(self) -> bool:
        """The rule is met: no more claims."""
        return self.reason is not None

    def may_claim(self, uncommitted: int) -> bool:
        """Whether a free slot may claim now: the rule is not met, and would not be even if
        every outcome not yet committed counted."""
        if self.rule is None:
            return True
        if self.reason is not None:
            return False
        with self._lock:
            return self._count + uncommitted < self._threshold()

    def ended(self, state: State, task: str | None = None) -> None:
        """A task ended ``state`` (final: a retry is no end); the halt when the rule is met.
        A task counts once (``gpuswarm retry`` of a failed one that fails again is one task
        failed); without ``task`` every call counts."""
        rule = self.rule
        if rule is None or state not in _COUNTED[rule.why]:
            return
        with self._lock:
            if task is not None:
                if task in self._counted:
                    return
                self._counted.add(task)
            self._count += 1
            if self.reason is not None or self._count < self._threshold():
                return
            self.reason = f"halt: {rule.what(self._count)} (halt {rule.text})"
            count = self._count
        how = (
            "running tasks are stopped and put back in the queue"
            if rule.when == "now"
            else "no new tasks; running ones finish"
        )
        with contextlib.suppress(OSError):  # a full disk must not keep the halt from happening
            self._ledger.emit(
                Ev.HALTED,
                spec=rule.text,
                when=rule.when,
                count=count,
                reason=f"{self.reason}: {how}",
            )
        if rule.when == "now":
            self._on_now(self.reason)
        else:
            self._on_soon()

    def _threshold(self) -> int:
        assert self.rule is not None
        if self.rule.percent and time.monotonic() - self._counted_at >= RECOUNT_SECONDS:
            self._recount()
        return self.rule.threshold(self._total)

    def _recount(self) -> None:
        self._counted_at = time.monotonic()
        with contextlib.suppress(OSError):
            counts = self._queue.counts()
            self._total = sum(n for s, n in counts.items() if s not in _APART)


_APART = (State.SKIPPED, State.CANCELLED)
