"""A descriptor's attempts and the budget they count against: the attempt series, what
counts against ``max_attempts`` (not interrupted, since the last fresh budget), the one rule
for a lost attempt (:meth:`AttemptBudget.lost_is_free`), interruptions and busy time.

A mixin of :class:`~gpuswarm.core.models.descriptor.Descriptor` over the same JSON object: no
state of its own (empty ``__slots__``), so a descriptor stays one slot and its methods are looked
up as if they were its own (the commit path records attempts through it on every task).
"""

from __future__ import annotations

from typing import Any

from gpuswarm.core.models.attempt import AttemptRecord
from gpuswarm.core.models.kinds import EndKind

# the MAX_LOST-th lost attempt in a row counts: the task may be what brings its supervisor or
# node down (it would be re-run for ever)
MAX_LOST = 3


class AttemptBudget:
    """The attempts part of a descriptor (its ``raw`` JSON object's ``attempts``,
    ``budget_from`` and ``interruptions``)."""

    __slots__ = ()
    raw: dict[str, Any]

    @property
    def attempts(self) -> list[AttemptRecord]:
        """Every attempt so far, interrupted and earlier budgets' ones too (a copy)."""
        return [AttemptRecord._of(a) for a in self.raw.get("attempts", [])]

    @property
    def attempt_count(self) -> int:
        return len(self.raw.get("attempts", []))

    @property
    def next_attempt(self) -> int:
        """The number the next attempt gets (every recorded one, interrupted included, + 1)."""
        return self.attempt_count + 1

    def add_attempt(self, record: AttemptRecord) -> None:
        self.raw.setdefault("attempts", []).append(record.to_json())

    def lost_is_free(self) -> bool:
        """The one rule for an attempt lost with what ran it (its supervisor killed, its ray
        driver or node gone): it is never the task's attempt, so it does not count against
        ``max_attempts``; unless the last MAX_LOST - 1 attempts were lost too (then it counts).
        Resume, a reclaiming supervisor and the committer (a lost ray attempt) all ask this."""
        recent = self.raw.get("attempts", [])[-(MAX_LOST - 1) :]
        return sum(1 for a in recent if a.get("kind") == EndKind.LOST.value) < MAX_LOST - 1

    def add_lost(self, record: AttemptRecord) -> bool:
        """Record a lost attempt by :meth:`lost_is_free`: interrupted (and one more
        interruption noted) when it is free. Returns whether it was."""
        free = self.lost_is_free()
        self.add_attempt(record.but(interrupted=free))
        if free:
            self.note_interrupted()
        return free

    @property
    def counted_attempts(self) -> list[AttemptRecord]:
        """The attempts that were not interrupted, of every budget."""
        return [a for a in self.attempts if a.counted]

    @property
    def counted_count(self) -> int:
        """How many attempts were not interrupted, of every budget (no records built)."""
        return sum(1 for a in self.raw.get("attempts", []) if not a.get("interrupted"))

    @property
    def last_counted(self) -> AttemptRecord | None:
        counted = self.counted_attempts
        return counted[-1] if counted else None

    @property
    def last_attempt(self) -> AttemptRecord | None:
        attempts = self.raw.get("attempts") or []
        return AttemptRecord._of(attempts[-1]) if attempts else None

    @property
    def attempts_used(self) -> int:
        """Attempts that count against ``max_attempts`` (interrupted ones and earlier budgets
        don't)."""
        begin = int(self.raw.get("budget_from", 0))
        return sum(1 for a in self.raw["attempts"][begin:] if not a.get("interrupted"))

    @property
    def budget_from(self) -> int:
        return int(self.raw.get("budget_from", 0))

    @property
    def interruptions(self) -> int:
        return int(self.raw.get("interruptions", 0))

    def note_interrupted(self) -> None:
        """Count one more interruption (an attempt a stop or a crash cut short)."""
        self.raw["interruptions"] = self.interruptions + 1

    @property
    def busy_seconds(self) -> float:
        """Seconds of every attempt (retries and interrupted ones too)."""
        return sum(float(a.get("duration") or 0) for a in self.raw.get("attempts", []))
