"""RunView: the one reducer of a run's journal. What runs where (slot -> task, attempt, since),
counts per state, slot health (quarantines), recent failures, and, when asked, the journal's
word on each task (its last state, started events, completions).

Every reader folds events through it: the supervisor's terminal lines and live table (fed by the
ledger), ``gpuswarm watch`` and ``research loop`` (fed by tailing events.jsonl from a snapshot of
the folders, ``store.reader.RunReader.view``) and ``gpuswarm check`` (the whole journal). Before,
two reducers and three "what runs where" computations disagreed about a run.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuswarm.core.events import (
    WAITING,
    Control,
    Ev,
    Event,
    Finished,
    Other,
    Quarantined,
    Recovered,
    Requeued,
    Shutdown,
    Slots,
    Started,
    SupervisorStarted,
    Unquarantined,
    decode,
)
from gpuswarm.core.models import State

RECENT_FAILURES = 5
PENDING, RUNNING = State.PENDING.value, State.RUNNING.value
DONE, FAILED = State.DONE.value, State.FAILED.value
CANCELLED = State.CANCELLED.value
BLOCKED = State.BLOCKED.value  # issue 35: waiting for prerequisites
_REQUEUED_FROM = (State.DONE.value, State.SKIPPED.value)  # gpuswarm requeue's, beside retry's
CONFIG_CHANGE = "config-change"
ADDED = "added"  # Ev.ADDED: tasks appended by ``gpuswarm add`` (core.events has no class for it)


@dataclass
class SlotRow:
    """One slot: the task it runs (empty: idle), which attempt, since when, and how many
    attempts it ended."""

    task: str = ""
    name: str = ""
    attempt: int = 0
    since: float = 0.0
    timeout: float | None = None
    done: int = 0


@dataclass
class TaskView:
    """The journal's word on one task: the state folder its last state-changing event names, its
    latest attempt and slot, how many ``started`` events it has, the attempts journaled done."""

    state: str = PENDING
    attempt: int = 0
    slot: str = ""
    started: int = 0
    completions: list[Any] = field(default_factory=list)


@dataclass
class RunView:
    """What a run looks like, updated event by event (thread-safe through ``lock``).

    ``counts`` are per queue state; a retry that waits out its backoff counts as pending (its
    next attempt has not started). ``tasks`` is None unless tracking was asked for (a live run
    of 100k tasks needs no per-task map)."""

    counts: dict[str, int]
    slots: dict[str, SlotRow] = field(default_factory=dict)
    failures: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_FAILURES))
    finished_times: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    started: float = field(default_factory=time.time)
    note: str = ""
    quarantined: dict[str, str] = field(default_factory=dict)  # slot -> reason ("probe": probed)
    tasks: dict[str, TaskView] | None = None
    # the slots the run's last supervisor has now (a cluster's nodes join and leave); None
    # when none is live
    supervisor_slots: set[str] | None = None
    added: int = 0  # tasks a config change or ``gpuswarm add`` added (the journal's count)
    paused: bool = False  # the whole run (``gpuswarm pause``), as the journal says
    paused_slots: set[str] = field(default_factory=set)
    held_gpus: dict[int, str] = field(default_factory=dict)  # GPU -> why it takes no task (19)
    waiting_room: dict[str, str] = field(default_factory=dict)  # task -> why it waits (19)
    # issue 34: what the agents' attempts spent, as the journal's ``finished`` lines say
    spent_usd: float = 0.0
    spent_tokens: int = 0
    spent_unknown: int = 0  # attempts whose cost is unknown (their tokens count)
    # issue 35: group -> state -> tasks, as ``status --group`` counts them (set by whoever
    # shows them: the metrics' RunStats, from outputs.groups.GroupCache); empty otherwise
    group_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    # task -> attempt a look at the folders counted running already: a slot journals its
    # ``started`` after the claim's rename, so that line may come after the look (issue 28)
    seen_running: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of_journal(
        cls, events: Iterable[Mapping[str, Any]], counts: dict[str, int] | None = None
    ) -> RunView:
        """The journal folded from its start, tracking every task (``check``)."""
        view = cls(dict(counts or {}), tasks={})
        for raw in events:
            view.apply(raw)
        return view

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def apply(self, raw: Mapping[str, Any], *, own: bool = False) -> Event | None:
        """Fold one journal line; its typed event, or None when it is of the wrong shape
        (skipped: nothing changes). ``own``: a record this process emitted (see decode)."""
        event = decode(raw, own=own)
        if event is not None:
            self.apply_event(event)
        return event

    def apply_event(self, event: Event) -> None:
        with self.lock:
            if isinstance(event, SupervisorStarted | Slots | Other):
                self._supervisor(event)
            self._apply(event)

    def _apply(self, e: Event) -> None:
        if isinstance(e, SupervisorStarted):
            for label in e.slots:
                self.slots.setdefault(label, SlotRow())
        elif isinstance(e, Started):
            self._started(e)
        elif isinstance(e, Finished):
            self._finished(e)
        elif isinstance(e, Requeued):
            self._requeued(e)
        elif isinstance(e, Recovered):
            if e.task is not None and e.state is not None:
                self._task(e.task).state = e.state
        elif isinstance(e, Quarantined | Unquarantined):
            self._health(e)
        elif isinstance(e, Control):
            self._control(e)
        elif isinstance(e, Shutdown | Slots):
            self._note(e)
        elif isinstance(e, Other):
            self._other(e)

    def _other(self, e: Other) -> None:
        if e.name == ADDED:
            self._added(e)
        elif e.name in (Ev.GPU_HELD.value, Ev.GPU_FREED.value):
            self._gpu_held(e)
        elif e.name == Ev.DEPENDENCY.value:  # issue 35: a blocked task moved
            self._dependency(e)
        elif e.name == Ev.HALTED.value:  # issue 28: the halt rule was met
            self.note = str(e.extra.get("reason") or "halted")
        elif e.name == Ev.BUDGET.value and e.extra.get("crossed"):  # issue 34: budget spent
            self.note = str(e.extra.get("reason") or "budget")
        elif e.name == Ev.GPU_WAIT.value:
            task, why = e.extra.get("task"), e.extra.get("reason")
            if isinstance(task, str) and isinstance(why, str):
                self.waiting_room[task] = why

    def _dependency(self, e: Other) -> None:
        task, frm, to = e.extra.get("task"), e.extra.get("frm"), e.extra.get("state")
        if isinstance(task, str) and isinstance(frm, str) and isinstance(to, str):
            self._move(frm, to)
            self._task(task).state = to
            if frm in _REQUEUED_FROM and to == BLOCKED:  # a requeue waiting for prerequisites
                self._task(task).completions.clear()

    def _added(self, e: Other) -> None:
        """Tasks appended by ``gpuswarm add``: pending, and counted for ``check``."""
        count = e.extra.get("count")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            blocked = e.extra.get("blocked")  # issue 35: those after prerequisites
            held = blocked if isinstance(blocked, int) and 0 < blocked <= count else 0
            self.counts[PENDING] = self.counts.get(PENDING, 0) + count - held
            self.counts[BLOCKED] = self.counts.get(BLOCKED, 0) + held
            self.added += count

    def _gpu_held(self, e: Other) -> None:
        """A GPU an ended attempt still holds (skipped), or freed again."""
        gpu = e.extra.get("gpu")
        if not isinstance(gpu, int) or isinstance(gpu, bool):
            return
        if e.name == Ev.GPU_FREED.value:
            self.held_gpus.pop(gpu, None)
            return
        reason = e.extra.get("reason")
        why = reason if isinstance(reason, str) else f"GPU {gpu} is still held"
        self.held_gpus[gpu] = why
        self.failures.append(why)

    def _health(self, e: Quarantined | Unquarantined) -> None:
        if isinstance(e, Quarantined):
            self.failures.append(f"slot {e.slot} quarantined: {e.reason or ''}")
            self.quarantined[e.slot] = e.reason or ""
        elif e.probe:
            self.quarantined[e.slot] = "probe"
        else:
            self.quarantined.pop(e.slot, None)

    def _move(self, frm: str, to: str) -> None:
        self.counts[frm] = max(0, self.counts.get(frm, 0) - 1)
        self.counts[to] = self.counts.get(to, 0) + 1

    def _task(self, task: str) -> TaskView:
        if self.tasks is None:
            return TaskView()  # not tracked: a throwaway
        return self.tasks.setdefault(task, TaskView())

    def _note(self, e: Shutdown | Slots) -> None:
        """A stop's note; a cluster's node that joined (its slots shown) or left (its idle
        slots go; a running one stays until its attempt ends ``lost``)."""
        if isinstance(e, Shutdown):
            if not (e.mode == "warm" and self.note.startswith("halt:")):  # a halt now: its why
                self.note = "stopping: Ctrl-C again kills at once" if e.mode == "warm" else ""
            return
        if e.change == "backend_lost":  # after its shutdown: the note says why
            self.note = f"stopping: {e.extra.get('reason') or 'the cluster is gone'}"
            return
        if e.change == "waiting":
            self.note = str(e.extra.get("reason") or "waiting for a node to join")
            return
        if e.change == "joined" and self.note.startswith("no slot left"):
            self.note = ""
        for label in e.slots:
            if e.change == "joined":
                self.slots.setdefault(label, SlotRow())
            elif e.change in ("left", "retired"):
                row = self.slots.get(label)
                if row is not None and not row.task:
                    del self.slots[label]

    def _started(self, e: Started) -> None:
        if self.seen_running.pop(e.task, None) != e.attempt:  # else: counted running already
            self._move(PENDING, RUNNING)
        self.waiting_room.pop(e.task, None)
        row = self.slots.setdefault(e.slot, SlotRow())
        row.task, row.name, row.attempt = e.task, e.name, e.attempt
        row.since = e.ts if e.ts is not None else time.time()
        row.timeout = e.timeout
        t = self._task(e.task)
        t.state, t.attempt, t.slot = RUNNING, e.attempt, e.slot
        t.started += 1

    def _finished(self, e: Finished) -> None:
        if e.tokens is not None or e.cost_usd is not None or e.cost_unknown:
            self.spent_tokens += e.tokens or 0
            self.spent_usd += e.cost_usd or 0.0
            self.spent_unknown += 1 if e.cost_unknown else 0
        self.seen_running.pop(e.task, None)  # its start, if still to come, is older
        state = e.state or FAILED
        to = PENDING if state == WAITING else state
        self._move(RUNNING, to if to in self.counts else FAILED)
        row = self.slots.get(e.slot)
        if row is not None:
            row.done += 1
            if row.task == e.task:  # the slot may have started its next task already
                row.task = ""
        if state == DONE:
            self.finished_times.append(e.ts if e.ts is not None else time.time())
        elif state == FAILED or e.retry:
            what = "retrying" if e.retry else "failed"
            self.failures.append(f"{e.task} {what}: {e.reason or ''}")
        if e.state is not None:
            t = self._task(e.task)
            t.state = RUNNING if e.state == WAITING else e.state  # waiting: still in running/
            if e.state == DONE:
                t.completions.append(e.attempt)

    def _requeued(self, e: Requeued) -> None:
        if e.task is not None:
            self.seen_running.pop(e.task, None)  # handed back: its next start moves it
        if e.reason == CONFIG_CHANGE and e.added is not None:
            self.added += e.added
        if e.frm == BLOCKED:  # issue 35: its prerequisites ended as it asked
            self._move(BLOCKED, PENDING)
        if e.frm in (FAILED, CANCELLED):  # gpuswarm retry, a resume's retry of failed ones
            self._move(e.frm, PENDING)
        elif e.frm in _REQUEUED_FROM:  # gpuswarm requeue: a fresh attempt series
            self._move(e.frm, PENDING)
            if e.task is not None:
                self._task(e.task).completions.clear()
        if e.frm == RUNNING:
            self._move(RUNNING, PENDING)
            for row in self.slots.values():
                if row.task == e.task:
                    row.task = ""
        if e.task is not None:
            self._task(e.task).state = PENDING

    def _control(self, e: Control) -> None:
        """A person's request applied: a task that went somewhere (cancelled) moves there,
        from running when the event names the slot its attempt was stopped on (a cancel of a
        task that was not running names none), else from pending."""
        if e.request in ("pause", "unpause"):
            self._paused(e.request == "pause", e.slot)
        if e.task is None or e.state is None:
            return  # a pause, an unpause: no task moves
        if e.state == CANCELLED:
            frm = BLOCKED if e.extra.get("frm") == BLOCKED else PENDING  # issue 35
            self._move(RUNNING if e.slot is not None else frm, CANCELLED)
            for row in self.slots.values():
                if row.task == e.task:
                    row.task = ""
        self._task(e.task).state = e.state

    def _paused(self, on: bool, slot: str | None) -> None:
        if slot is None:
            self.paused = on
        elif on:
            self.paused_slots.add(slot)
        else:
            self.paused_slots.discard(slot)

    def _supervisor(self, e: SupervisorStarted | Slots | Other) -> None:
        """The last supervisor's slots: those it started with, then its cluster's changes."""
        if isinstance(e, SupervisorStarted):
            self.supervisor_slots = set(e.slots)
        elif isinstance(e, Other):
            if e.name == Ev.SUPERVISOR_STOPPED.value:
                self.supervisor_slots = None
        elif self.supervisor_slots is not None:
            if e.change == "joined":
                self.supervisor_slots |= set(e.slots)
            elif e.change in ("left", "retired", "preflight_failed"):
                self.supervisor_slots -= set(e.slots)
            elif e.change == "backend_lost":
                self.supervisor_slots = set()

    def eta(self, now: float) -> float | None:
        """Seconds left at the recent completion rate (None until something completed)."""
        left = self.counts.get(PENDING, 0) + self.counts.get(RUNNING, 0)
        left += self.counts.get(BLOCKED, 0)  # issue 35: they run once released
        times = self.finished_times
        if not times or left == 0:
            return None
        window_start = times[0] if len(times) > 1 else self.started
        rate = len(times) / max(1e-6, now - window_start)
        return left / rate
