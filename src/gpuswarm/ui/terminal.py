"""Terminal lines of a run: one line per transition (``HH:MM:SS slot event task detail``).

The supervisor's reporter listens to ledger events (no folder scans); ``gpuswarm watch --plain``
prints the same lines for the journal it follows. The counts each line ends with come from the
one reducer, :class:`~gpuswarm.core.runview.RunView`. (The rich live table, ``ui/table.py``,
builds on the same events.)
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from gpuswarm.core.events import (
    Control,
    Corrupt,
    Ev,
    Event,
    Finished,
    Other,
    Quarantined,
    Requeued,
    Shutdown,
    Slots,
    Started,
    Unquarantined,
    decode,
)
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import inert
from gpuswarm.core.runview import RunView
from gpuswarm.core.words import counted
from gpuswarm.store import control


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal that can show the live table."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def paused_now(paths: RunPaths, every: float = 0.5) -> Callable[[], tuple[bool, frozenset[str]]]:
    """What is paused now (the run, the slots), read from the run's pause flags at most every
    ``every`` seconds (one listdir): a pause another process set shows without a journal line."""
    last: list[Any] = [0.0, (False, frozenset())]

    def read() -> tuple[bool, frozenset[str]]:
        now = time.monotonic()
        if now - last[0] >= every:
            flags = control.paused(paths)
            last[0], last[1] = now, (flags.run, flags.slots)
        found: tuple[bool, frozenset[str]] = last[1]
        return found

    return read


RECOUNT_SECONDS = 2.0  # a live run's plain lines take the queue's counts again this often
HELD_SECONDS = 1.0  # a start line waits at most this long for the end line before it

WARM_STOP = "stopping: no new tasks, handing running ones back (Ctrl-C again: kill at once)"


_GPU_LINES = {  # GPU memory events worth a line (issue 19), with their prefix
    Ev.GPU_HELD.value: "GPU HELD: ",
    Ev.GPU_WAIT.value: "waiting: ",
    Ev.HALTED.value: "",  # issue 28: "halt: 3 tasks failed (halt soon,fail=3): no new ..."
    Ev.STALLED.value: "",  # issue 34: "stalled: no output, ... for 600s; its last output: ..."
    Ev.BUDGET.value: "",  # issue 34: "budget: $1.20 spent of budget.usd $1.00; raise it: ..."
}


def slots_line(e: Slots) -> str | None:
    """A cluster's change in one line (backend ray): a node joined or left, the run waits for
    one, the head is lost; None for the changes a person need not see (adopted attempts)."""
    node = f"node {e.node[:6]}" if e.node else "the head"
    where = f"{node} ({e.host})" if e.host else node
    reason = str(e.extra.get("reason") or "")
    if e.change == "joined":
        return f"{where} joined: {counted(len(e.slots), 'slot')}"
    if e.change == "left":
        if not e.node:
            return f"the cluster's head is gone: {counted(len(e.slots), 'slot')} retired"
        return (
            f"{where} left the cluster: {counted(len(e.slots), 'slot')} retired, "
            "what ran there goes back to the queue (Ray's messages: ray.log)"
        )
    if e.change in ("waiting", "backend_lost"):
        return reason or e.change
    if e.change in ("setup_failed", "preflight_failed"):
        return f"{where} {e.change.replace('_', ' ')}: {reason or e.extra.get('rc', '')}"
    return None


class PlainReporter:
    """Prints ``HH:MM:SS slot event task detail [done/total]`` lines.

    As a ledger listener (``reporter(event)``) it folds each event into its own view first;
    given the ``view`` a caller folds itself (``watch``), it only prints (:meth:`show`).
    ``recount``: the queue's counts now (a live run's supervisor hears only its own events,
    not another process's ``add`` or ``retry --failed``): the ``[done/total]`` total follows
    the queue, and so do done and failed: this supervisor's events, plus what the queue shows
    beyond them (a retry, a ``work`` sibling's ends) at the last recount."""

    def __init__(
        self,
        counts: Mapping[State, int] | None = None,
        stream: TextIO | None = None,
        *,
        view: RunView | None = None,
        recount: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        counts = counts or {}
        self.view = view or RunView({s.value: counts.get(s, 0) for s in State})
        self.stream = stream or sys.stderr
        self.recount = recount
        self._counted: float | None = None
        self._tasks = self.view.total
        self._drift: dict[str, int] = {}  # done/failed: the queue's minus our events' (recount)
        self._lock = threading.Lock()
        # a slot's next task starts the moment it is free, before a committer thread has
        # journaled the last one's end: its start line waits for that end (HELD_SECONDS at most)
        self._open: dict[str, list[str]] = {}  # slot -> tasks whose start is printed, no end
        self._held: dict[str, deque[tuple[float, str, str]]] = {}  # slot -> (since, task, line)

    def __call__(self, raw: dict[str, Any]) -> None:
        event = decode(raw, own=True)  # a ledger listener: records this process emitted
        if event is not None:  # a line of the wrong shape: every reader skips it
            if isinstance(event, Finished):  # a line with [done/total]: the queue's counts
                self._recount()  # before the event: its move is journaled before its rename
            self.view.apply_event(event)
            self.show(event)

    def _recount(self) -> None:
        """Every RECOUNT_SECONDS, the queue's counts: the run's task count (a sum over its
        folders, which no move in flight changes) and how far its done and failed are from
        what our events say (what other processes did: a ``retry``, a sibling's ends)."""
        if self.recount is None:
            return
        if self._counted is not None and time.monotonic() - self._counted < RECOUNT_SECONDS:
            return
        self._counted = time.monotonic()
        try:
            fresh = self.recount()
        except OSError:
            return
        self._tasks = sum(fresh.values())
        with self.view.lock:
            own = dict(self.view.counts)
        self._drift = {k: fresh.get(k, 0) - own.get(k, 0) for k in ("done", "failed")}

    def _total(self) -> int:
        """The run's task count: the queue's at the last recount; the view's without one."""
        return self.view.total if self.recount is None else self._tasks

    def show(self, event: Event) -> None:
        line = self._line(event)
        with self._lock:
            out = self._ordered(event, None if line is None else inert(line))  # no escapes
            if out:
                self.stream.write("".join(text + "\n" for text in out))
                self.stream.flush()

    def _ordered(self, e: Event, line: str | None) -> list[str]:
        """The lines to print now: a slot's start only after the end of the task it ran
        before (each slot runs one task at a time; the journal may say the next start first)."""
        now = time.monotonic()
        out: list[str] = []
        for slot, held in self._held.items():  # waited long enough: printed as they are
            while held and now - held[0][0] > HELD_SECONDS:
                out.append(self._release(slot))
        if isinstance(e, Started) and line is not None:
            if self._open.get(e.slot) or self._held.get(e.slot):
                self._held.setdefault(e.slot, deque()).append((now, e.task, line))
            else:
                self._open[e.slot] = [e.task]
                out.append(line)
            return out
        ended = e.task if isinstance(e, (Finished, Requeued)) else None
        where = self._slot_of(ended) if ended is not None else None
        if where is not None:
            held = self._held.get(where, deque())
            while any(task == ended for _, task, _ in held):  # its start first
                out.append(self._release(where))
        out += [line] if line is not None else []
        if where is not None:
            self._open[where].remove(str(ended))
            if not self._open[where] and self._held.get(where):
                out.append(self._release(where))  # the slot's next task: its start now
        return out

    def _release(self, slot: str) -> str:
        _, task, line = self._held[slot].popleft()
        self._open.setdefault(slot, []).append(task)
        return line

    def _slot_of(self, task: str) -> str | None:
        for slot, tasks in self._open.items():
            if task in tasks:
                return slot
        for slot, held in self._held.items():
            if any(t == task for _, t, _ in held):
                return slot
        return None

    def _progress(self) -> str:
        with self.view.lock:
            c = dict(self.view.counts)
        for key, off in self._drift.items():
            c[key] = max(0, c.get(key, 0) + off)
        extra = f", {c.get('failed', 0)} failed" if c.get("failed") else ""
        return f"[{c.get('done', 0)}/{self._total()} done{extra}]"

    def _line(self, e: Event) -> str | None:
        stamp = time.strftime("%H:%M:%S", time.localtime(e.ts if e.ts is not None else time.time()))
        if isinstance(e, Started):
            detail = f"attempt {e.attempt}" if e.attempt > 1 else ""
            return f"{stamp} {e.slot:<8} start  {e.task} {detail}".rstrip()
        if isinstance(e, Finished):
            return self._finished(stamp, e)
        if isinstance(e, Quarantined):
            return f"{stamp} {e.slot:<8} QUARANTINED: {e.reason or ''}"
        if isinstance(e, Unquarantined):
            what = "probe: claims one task" if e.probe else f"back: {e.reason or ''}"
            return f"{stamp} {e.slot:<8} quarantine {what}"
        if isinstance(e, Requeued) and e.frm == "running":
            return f"{stamp} {'':<8} requeued {e.task} ({e.reason or ''})"
        if isinstance(e, Shutdown):
            what = "killing everything now" if e.mode == "cold" else WARM_STOP
            return f"{stamp} {'':<8} {what}"
        if isinstance(e, Corrupt):
            return f"{stamp} {'':<8} corrupt descriptor moved aside: {e.file}"
        if isinstance(e, Control):
            what = e.task or (f"slot {e.slot}" if e.slot else "the run")
            to = f" -> {e.state}" if e.state else (f": {e.dropped}" if e.dropped else "")
            return f"{stamp} {e.slot or '':<8} {e.request} {what}{to} (by {e.by or '?'})"
        if isinstance(e, Slots):
            change = slots_line(e)
            return f"{stamp} {'':<8} {change}" if change else None
        if isinstance(e, Other) and e.name in _GPU_LINES:  # issue 19: GPU memory
            return f"{stamp} {'':<8} {_GPU_LINES[e.name]}{e.extra.get('reason') or ''}"
        return None

    def _finished(self, stamp: str, e: Finished) -> str:
        secs = f"{float(e.seconds or 0):.1f}s"
        why = e.reason or ""
        if e.state == "done":
            return f"{stamp} {e.slot:<8} done   {e.task} {secs} {self._progress()}"
        if e.state == "skipped":
            return f"{stamp} {e.slot:<8} skip   {e.task} {why} {self._progress()}"
        if e.state == "cancelled":
            return f"{stamp} {e.slot:<8} cancel {e.task} {why} {self._progress()}"
        if e.retry:
            wait = f", again in {e.retry_in:g}s" if e.retry_in else ""
            # the attempt's own number (its start line's, its attempt-<n>/ folder), then the
            # budget: interrupted attempts and a resume's fresh budget make them differ
            n = f"attempt {e.attempt}, " if e.attempt is not None else ""
            used = e.used if e.used is not None else e.attempt
            of = e.max_attempts if e.max_attempts is not None else "?"
            return (
                f"{stamp} {e.slot:<8} retry  {e.task} {why} ({n}{used}/{of} of max_attempts "
                f"used{wait}) {self._progress()}"
            )
        return f"{stamp} {e.slot:<8} FAILED {e.task} {why} {secs} {self._progress()}"
