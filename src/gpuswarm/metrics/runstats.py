"""One run's figures for ``/metrics``, kept up to date by what changed since the last scrape.

Three sources, each read incrementally:

- the run's :class:`~gpuswarm.core.runview.RunView` (``ui.watch.Follower``: one look at the
  folders, then the journal's new lines): tasks by state, slots, quarantined slots now;
- the journal folded once from its first line (:class:`JournalFold`), for what only grows:
  attempts started, attempts ended by outcome, each slot's busy seconds, idle gaps between a
  slot's attempts, quarantines;
- the attempt records of ended tasks (done, failed, skipped, cancelled), each descriptor read
  once (:class:`RecordFold`): ends by kind, measured VRAM peaks, energy, tokens and cost (the
  agent accounting's fields, read where a record has them). A folder is listed again only when
  the RunView says its count changed.

Nothing here writes, and nothing runs on the supervisor's side: a scrape costs the exporter's
process a stat of the journal and the new lines, and a listing only when tasks ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuswarm.core.events import (
    WAITING,
    Control,
    Event,
    Finished,
    Quarantined,
    Requeued,
    Started,
    SupervisorStarted,
    decode,
)
from gpuswarm.core.models import AttemptRecord, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.records import PEAK_VRAM_FIELD
from gpuswarm.core.runview import RunView
from gpuswarm.outputs.groups import GroupCache
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.ledger import EventTail
from gpuswarm.ui.watch import Follower

#: idle gap buckets (seconds): the time a slot stood free between two attempts
IDLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: peak VRAM buckets (MiB) of ended attempts
VRAM_BUCKETS = (
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    24576,
    32768,
    49152,
    65536,
    81920,
    98304,
    131072,
    196608,
)
#: the journal's outcome of an ended attempt (label ``outcome``): a bounded set
OUTCOMES = ("done", "failed", "retried", "skipped", "cancelled", "interrupted")
# the ended tasks whose attempt records are read: dependency_failed ones never ran
RAN_AND_ENDED = tuple(s for s in State.terminal() if s is not State.DEPENDENCY_FAILED)
TOKEN_FIELDS = ("tokens_in", "tokens_cached", "tokens_out")


@dataclass
class Histogram:
    """Counts per upper bound (cumulative when read), their sum and count."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break

    def buckets(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            running += count
            out.append((_le(bound), float(running)))
        out.append(("+Inf", float(self.n)))
        return out


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and bound >= 1 else repr(float(bound))


@dataclass
class SlotFold:
    first: float | None = None  # when it was first seen (its supervisor's start)
    busy: float = 0.0  # seconds of ended attempts
    last: tuple[str, int] | None = None  # the attempt it started last


Key = tuple[str, int]  # (task, attempt)


class JournalFold:
    """The journal from its first line: what only grows (see the module docstring).

    The committer journals ``finished`` in batches, so a slot's next ``started`` may come
    before its previous attempt's ``finished``: an attempt's end is its start plus its
    ``seconds``, and the idle gap before an attempt is measured once both ends are known."""

    def __init__(self, path: Path) -> None:
        self._tail = EventTail(path, from_end=False)
        self.started = 0
        self.ended: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.quarantines = 0
        self.slots: dict[str, SlotFold] = {}
        self.idle = Histogram(IDLE_BUCKETS)
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self._running: dict[str, tuple[int, str, float]] = {}  # task -> attempt, slot, start
        self._next_start: dict[Key, float] = {}  # an attempt -> the start after it on its slot
        self._ended_at: dict[Key, float] = {}  # a slot's last attempt -> its end (no next yet)

    def poll(self) -> None:
        for raw in self._tail.poll():
            event = decode(raw)
            if event is not None:
                self.apply(event)

    def _slot(self, label: str, ts: float) -> SlotFold:
        row = self.slots.get(label)
        if row is None:
            row = self.slots[label] = SlotFold(first=ts)
        return row

    def apply(self, e: Event) -> None:
        ts = e.ts if e.ts is not None else time.time()
        self.first_ts = ts if self.first_ts is None else self.first_ts
        self.last_ts = ts
        if isinstance(e, SupervisorStarted):
            for label in e.slots:
                self._slot(label, ts)
        elif isinstance(e, Started):
            self._started(e, ts)
        elif isinstance(e, Finished):
            self.ended[_outcome(e)] += 1
            self._end(e.task, ts, e.seconds)
        elif isinstance(e, Requeued) and e.frm == State.RUNNING.value and e.task:
            self.ended["interrupted"] += 1
            self._end(e.task, ts, None)
        elif isinstance(e, Control) and e.state == State.CANCELLED.value and e.slot and e.task:
            self.ended["cancelled"] += 1
            self._end(e.task, ts, None)
        elif isinstance(e, Quarantined):
            self.quarantines += 1

    def _started(self, e: Started, ts: float) -> None:
        self.started += 1
        row = self._slot(e.slot, ts)
        prev, row.last = row.last, (e.task, e.attempt)
        self._running[e.task] = (e.attempt, e.slot, ts)
        if prev is None:
            return
        end = self._ended_at.pop(prev, None)
        if end is not None:
            self.idle.observe(max(0.0, ts - end))
        else:
            self._next_start[prev] = ts

    def _end(self, task: str, ts: float, seconds: float | None) -> None:
        got = self._running.pop(task, None)
        if got is None:
            return  # started before the journal's first line we read, or ended twice
        attempt, slot, start = got
        end = start + seconds if seconds is not None and seconds >= 0 else ts
        row = self._slot(slot, start)
        row.busy += max(0.0, end - start)
        key = (task, attempt)
        nxt = self._next_start.pop(key, None)
        if nxt is not None:
            self.idle.observe(max(0.0, nxt - end))
        elif row.last == key:  # the slot's next start is still to come
            self._ended_at[key] = end

    def busy_seconds(self, label: str, now: float) -> float:
        row = self.slots[label]
        live = sum(now - t for _, s, t in self._running.values() if s == label and now > t)
        return row.busy + live

    def busy_ratio(self, label: str, now: float) -> float:
        """Busy seconds over the slot's life (its first appearance to ``now``)."""
        row = self.slots[label]
        span = now - (row.first if row.first is not None else now)
        return min(1.0, self.busy_seconds(label, now) / span) if span > 0 else 0.0


def _outcome(e: Finished) -> str:
    state = e.state or State.FAILED.value
    if state in (WAITING, State.PENDING.value) or e.retry:
        return "retried"
    return state if state in OUTCOMES else "failed"


@dataclass
class RecordFold:
    """Attempt records of ended tasks, each task's attempts counted once (by number)."""

    by_kind: dict[str, int] = field(default_factory=dict)
    vram: Histogram = field(default_factory=lambda: Histogram(VRAM_BUCKETS))
    energy: dict[str, float] = field(default_factory=dict)  # "exclusive" / "shared" -> J
    energy_attempts: int = 0
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_FIELDS, 0))
    cost_usd: float = 0.0
    costed: int = 0  # attempts with a cost
    seen: dict[str, int] = field(default_factory=dict)  # task id -> last attempt counted
    listed: dict[str, int] = field(default_factory=dict)  # state -> count when last listed
    names: dict[str, set[str]] = field(default_factory=dict)  # state -> names last listed

    def add(self, task_id: str, records: Sequence[AttemptRecord]) -> None:
        last = self.seen.get(task_id, 0)
        for rec in records:
            if rec.n <= last:
                continue
            last = max(last, rec.n)
            self.by_kind[rec.kind or "unknown"] = self.by_kind.get(rec.kind or "unknown", 0) + 1
            if (peak := getattr(rec, PEAK_VRAM_FIELD)) is not None:
                self.vram.observe(peak)
            self._energy(rec)
            self._agent(rec)
        self.seen[task_id] = last

    def _energy(self, rec: AttemptRecord) -> None:
        joules = _number(getattr(rec, "energy_j", None))
        if joules is None:
            return
        mode = getattr(rec, "energy_mode", None)
        mode = mode if mode in ("exclusive", "shared") else "exclusive"
        self.energy[mode] = self.energy.get(mode, 0.0) + joules
        self.energy_attempts += 1

    def _agent(self, rec: AttemptRecord) -> None:
        """The agent accounting's fields (issue 34), where a record has them."""
        for name in TOKEN_FIELDS:
            value = _number(getattr(rec, name, None))
            if value is not None:
                self.tokens[name] += int(value)
        cost = _number(getattr(rec, "cost_usd", None))
        if cost is not None:
            self.cost_usd += cost
            self.costed += 1


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class RunStats:
    """One run followed for ``/metrics`` (thread-safe: a scrape at a time)."""

    def __init__(self, paths: RunPaths, label: str) -> None:
        self.paths = paths
        self.label = label  # the run's label value: "<name>/<run folder>"
        self.follower = Follower(paths)
        self.journal = JournalFold(paths.events)
        self.records = RecordFold()
        self.live = False
        self._lock = threading.Lock()
        self.groups = GroupCache(QueueFolders(paths))  # issue 35: status --group's counts

    @property
    def view(self) -> RunView:
        return self.follower.view

    def refresh(self) -> None:
        """Fold what changed since the last call: new journal lines, newly ended tasks."""
        with self._lock:
            self.follower.poll()
            self.journal.poll()
            self.live = self.follower.reader.live()
            self._read_ended()
            groups = {g: dict(t["counts"]) for g, t in self.groups.get().items()}
            with self.view.lock:
                self.view.group_counts = groups

    def _read_ended(self) -> None:
        with self.view.lock:
            counts = dict(self.view.counts)
        reader = self.follower.reader
        for state in RAN_AND_ENDED:
            now = counts.get(state.value, 0)
            if self.records.listed.get(state.value) == now:
                continue  # nothing moved there since the last listing
            self.records.listed[state.value] = now
            listed = set(reader.names(state))
            new = listed - self.records.names.get(state.value, set())
            self.records.names[state.value] = listed
            for name in sorted(new):  # only names that came since the last listing
                desc = reader.read(state, name)
                if desc is None:
                    continue
                attempts = desc.attempts
                if attempts and attempts[-1].n > self.records.seen.get(desc.id, 0):
                    self.records.add(desc.id, attempts)

    def now(self) -> float:
        """The end of the busy-ratio window: now while the run is live, else its last event."""
        if self.live or self.journal.last_ts is None:
            return time.time()
        return self.journal.last_ts
