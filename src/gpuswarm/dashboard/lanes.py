"""The run page's Gantt lanes: one bar per attempt, its colour from how it ended, and the host
and GPUs a slot label names (what :mod:`.runhub` draws the lanes with)."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuswarm.core.events import (
    WAITING,
    Control,
    Event,
    Finished,
    Other,
    Requeued,
    Started,
    SupervisorStarted,
)
from gpuswarm.core.models import State
from gpuswarm.core.runview import SlotRow

BARS_PER_LANE = 300  # recent attempts kept per slot for the Gantt chart

_SLOT_RE = re.compile(r"^(?P<host>.+)-gpu(?P<gpus>\d+(?:\+\d+)*)(?:\.(?P<share>\d+))?$")


@dataclass
class Bar:
    """One attempt on a lane: ``end`` None while it runs."""

    task: str
    attempt: int
    start: float
    end: float | None = None
    outcome: str = "running"

    def as_json(self) -> list[Any]:
        return [
            round(self.start, 3),
            None if self.end is None else round(self.end, 3),
            self.outcome,
            self.task,
            self.attempt,
        ]


def outcome_of(e: Finished) -> str:
    """The bar colour of an ended attempt: done, failed, timeout, retried, skipped."""
    reason = e.reason or ""
    if e.state in (WAITING, State.PENDING.value) or e.retry:
        return "timeout" if reason.startswith("timeout") else "retried"
    if e.state == State.FAILED.value and reason.startswith("timeout"):
        return "timeout"
    return e.state or State.FAILED.value


def slot_place(label: str) -> tuple[str, list[int]]:
    """The host and GPU ids a slot label names (``<host>-gpu0+1.2``); ("", []) for others."""
    m = _SLOT_RE.match(label)
    if m is None:
        return "", []
    return m.group("host"), [int(g) for g in m.group("gpus").split("+")]


def natural(label: str) -> tuple[Any, ...]:
    """A sort key that orders ``gpu2`` before ``gpu10``."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", label))


def close_bar(
    lane: deque[Bar] | None,
    task: str | None,
    ts: float | None,
    outcome: str,
    seconds: float | None = None,
) -> None:
    """End the newest open bar of ``task`` on ``lane`` (its attempt took ``seconds``)."""
    for bar in reversed(lane or ()):
        if bar.end is None and bar.task == task:
            end = ts or time.time()
            if seconds is not None and seconds >= 0:
                end = min(end, bar.start + seconds)
            bar.end, bar.outcome = end, outcome
            return


def add_event(lanes: dict[str, deque[Bar]], e: Event, slots: Mapping[str, SlotRow]) -> None:
    """Draw one journal event on the lanes (``slots``: the run's view of what runs where)."""
    if isinstance(e, SupervisorStarted):
        for label in e.slots:
            lanes.setdefault(label, deque(maxlen=BARS_PER_LANE))
    elif isinstance(e, Started):
        lane = lanes.setdefault(e.slot, deque(maxlen=BARS_PER_LANE))
        lane.append(Bar(e.task, e.attempt, e.ts or time.time()))
    elif isinstance(e, Finished):
        # committed after the slot may have started its next task: found by task
        close_bar(lanes.get(e.slot), e.task, e.ts, outcome_of(e), e.seconds)
    elif isinstance(e, Control) and e.state == State.CANCELLED.value and e.slot:
        close_bar(lanes.get(e.slot), e.task, e.ts, "cancelled")
    elif isinstance(e, Requeued) and e.frm == State.RUNNING.value and e.task:
        for lane in lanes.values():
            close_bar(lane, e.task, e.ts, "interrupted")
    elif isinstance(e, Other) and e.name == "supervisor_stopped":
        for label, lane in lanes.items():  # another supervisor's slots go on
            row = slots.get(label)
            for bar in lane:
                if bar.end is None and (row is None or row.task != bar.task):
                    bar.end, bar.outcome = e.ts or time.time(), "interrupted"
