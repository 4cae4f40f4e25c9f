"""The slot circuit breaker: take a slot out of rotation when *its GPU* looks broken, and only then.

A failure counts against a slot only when it could be the device's: an exit with a non-zero code,
a signal or a timeout. A program that cannot be found or started, a declared skip exit code and a
stop never count (every slot would see them). A slot trips when

1. its last ``failures`` attempts all failed that way, within ``window`` seconds, and
2. the other slots did well meanwhile: since the first of those failures they ended at least one
   attempt successfully and at most one in five of their attempts failed; or a task that failed
   on this slot has since succeeded on another one (and no other slot is failing as badly).

So failures that every slot sees (a bad batch of tasks, a missing credential) quarantine nothing,
and a broken GPU is found as soon as the others show that the same work succeeds. With one slot
there is nothing to compare: it never trips. A quarantined slot is probed again after
``cooldown`` seconds (it claims one task: a success lifts the quarantine, a failure doubles the
cool-down) and can be lifted by hand (``gpuswarm unquarantine RUN SLOT``), which removes its file
in ``.parallel/quarantine/``; the supervisor notices within a second.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import AttemptEnd

#: Ends that are the task's (or the setup's) own doing, never a device's.
NOT_THE_DEVICE = frozenset(
    {
        EndKind.NOT_FOUND,
        EndKind.NOT_EXECUTABLE,
        EndKind.SPAWN_ERROR,
        EndKind.CANCELLED,
        EndKind.STALLED,  # issue 34: the task did nothing: not the device's fault
    }
)
OTHERS_MAX_FAILURE_SHARE = 0.2  # the other slots' failure share for a slot to be blamed
RECENT = 512  # ends of all slots remembered for the comparison


@dataclass
class _End:
    slot: str
    task: str
    ended: float
    ok: bool
    suspect: bool  # a failure that could be the device's


@dataclass
class _Slot:
    streak: deque[_End] = field(default_factory=deque)
    cooldown: float = 0.0
    probing: bool = False


def is_suspect(end: AttemptEnd, neutral: bool) -> bool:
    """A failure that could be the device's (see the module docstring)."""
    return not neutral and not end.ok and end.kind not in NOT_THE_DEVICE


class Breaker:
    """Per-slot health from attempt ends; says when to quarantine and when a probe lifts it."""

    def __init__(self, failures: int, window: float, cooldown: float) -> None:
        self.failures = failures
        self.window = window
        self.cooldown = cooldown
        self._slots: dict[str, _Slot] = {}
        self._recent: deque[_End] = deque(maxlen=RECENT)
        self._ok_on: dict[str, set[str]] = {}  # task -> slots it succeeded on (recently)

    def record(self, slot: str, task: str, end: AttemptEnd, *, neutral: bool = False) -> str:
        """Record an end on ``slot``: "trip" (quarantine it now), "lift" (its probe succeeded),
        "again" (its probe failed: quarantine again, longer), or "" (nothing to do)."""
        if end.kind is EndKind.CANCELLED or self.failures <= 0:
            return ""
        state = self._slots.setdefault(slot, _Slot())
        item = _End(slot, task, end.ended, end.ok, is_suspect(end, neutral))
        self._recent.append(item)
        if item.ok:
            self._ok_on.setdefault(task, set()).add(slot)
            if len(self._ok_on) > RECENT * 4:
                self._ok_on.pop(next(iter(self._ok_on)))
        if state.probing:
            state.probing = False
            if item.suspect:
                state.cooldown *= 2
                return "again"
            state.streak.clear()
            return "lift"
        if item.suspect:
            state.streak.append(item)
            while len(state.streak) > self.failures:
                state.streak.popleft()
        elif item.ok:
            state.streak.clear()
        return "trip" if self._blame(slot) else ""

    def others_tripped(self) -> list[str]:
        """Slots whose failure streak the latest successes elsewhere now incriminate."""
        return [s for s in self._slots if self._blame(s)]

    def _blame(self, slot: str) -> bool:
        state = self._slots[slot]
        if state.probing or len(state.streak) < self.failures:
            return False
        first, last = state.streak[0], state.streak[-1]
        if last.ended - first.ended > self.window:
            return False
        others = [e for e in self._recent if e.slot != slot and e.ended >= first.ended]
        ok = sum(1 for e in others if e.ok)
        bad = sum(1 for e in others if e.suspect)
        if ok >= 1 and bad <= OTHERS_MAX_FAILURE_SHARE * (ok + bad):
            return True
        elsewhere = any(self._ok_on.get(e.task, set()) - {slot} for e in state.streak)
        return elsewhere and ok > bad

    def quarantined(self, slot: str) -> float:
        """The slot is out of rotation now; returns its cool-down (seconds before a probe)."""
        state = self._slots.setdefault(slot, _Slot())
        state.streak.clear()
        state.cooldown = state.cooldown or self.cooldown
        return state.cooldown

    def probe(self, slot: str) -> None:
        """The slot's cool-down is over: its next end decides."""
        self._slots.setdefault(slot, _Slot()).probing = True

    def lifted(self, slot: str) -> None:
        """Lifted by hand: a clean slate."""
        self._slots[slot] = _Slot()
