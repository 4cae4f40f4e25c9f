"""An ended run as the dashboard shows it: what report.html shows, from the same sources.

A live run's page is built from the journal as it comes (the recent failures, the attempts that
ended on a slot since the page's server started, a window that ends now). An ended run has no
"now": its page shows the run as a whole, read once per change of its summary through the read
model (``RunReader``: every descriptor's attempts, as report.html's slot table and timeline)
and its ``summary.json`` (the failures with their reasons, the quarantined slots):

- every attempt as a Gantt bar, in the window from the first start to the last end;
- per slot: its attempts, how many exited 0, its busy seconds and busy share of that window;
- the failures (``summary.json``'s list, the first 200, with the true count) and quarantines
  (the summary's record); for a run that ended without a summary (a crash), the same list
  from the descriptors (``results.row_for``) and the run's quarantine files.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from gpuswarm.core.fsutil import read_json
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import Redactor, env_secret_values, inert
from gpuswarm.dashboard.payloads import FinalBar, FinalView, ShownQuarantine, SlotCount, SlotShare
from gpuswarm.outputs.results import APART, row_for
from gpuswarm.outputs.taskrow import FailureJson, TaskRow
from gpuswarm.outputs.timeline import bars_from_descriptor
from gpuswarm.store.reader import RunReader

MAX_FAILURES = 200  # summary.json keeps the first 200 (not_done is the true count)
MAX_BARS = 300  # a lane's newest bars sent to the page (the share counts every attempt)
SUMMARY_BYTES = 32 << 20  # a summary.json larger than this is not read
ENDED_WELL = (State.DONE, *(State(s) for s in APART))  # not failures (summary.json's rule)
SYNC_TASKS = 5000  # a run of more tasks is read in a thread (the page paints first)


def read_summary(paths: RunPaths) -> Mapping[str, object]:
    """The run's summary.json, {} when it has none (a crashed run) or it cannot be read. Any
    JSON object: an older version's or a hand-edited one reads too (each key is narrowed
    where it is read)."""
    try:
        if paths.summary_json.stat().st_size > SUMMARY_BYTES:
            return {}
        data = read_json(paths.summary_json)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def merged_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """The time covered by ``intervals`` (overlaps counted once)."""
    total, at = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > at:
            total += end - max(start, at)
            at = end
    return total


class _Slots:
    """Per slot: attempts, exit 0, the attempts' bars (as report.html's slot table counts)."""

    def __init__(self) -> None:
        self.stats: dict[str, SlotCount] = {}
        self.bars: dict[str, list[FinalBar]] = {}
        self.secrets: set[str] = set()  # every task's own (as report.html redacts them)
        self.failures: list[FailureJson] = []  # as summary.json lists them (for a run
        self.not_done = 0  # that ended without one): every task not done, skipped, cancelled

    def add(self, state: State, desc: Descriptor) -> None:
        if desc.env:
            self.secrets |= env_secret_values(desc.env)
        if state not in ENDED_WELL:
            self.not_done += 1
            if len(self.failures) < MAX_FAILURES:
                self.failures.append(row_for(state, desc).values.failure_json())
        for att in desc.attempts:
            if not att.slot:
                continue
            one = self.stats.setdefault(str(att.slot), {"attempts": 0, "exited": 0})
            one["attempts"] += 1
            one["exited"] += int(att.kind == "exited" and att.returncode == 0)
        timed = [a for a in desc.attempts if a.started is not None and a.ended is not None]
        for att, bar in zip(timed, bars_from_descriptor(desc, state.value), strict=False):
            outcome = bar.outcome
            if outcome == "failed" and state in (State.SKIPPED, State.CANCELLED):
                outcome = state.value  # its last attempt ended it skipped or cancelled
            self.bars.setdefault(bar.lane, []).append(
                FinalBar(round(bar.start, 3), round(bar.end, 3), outcome, bar.task, att.n)
            )


def final_view(paths: RunPaths, redactor: Redactor, slots: Iterable[str] = ()) -> FinalView:
    """The ended run's page data: ``window`` [first start, last end], ``busy_share`` over every
    lane, ``slots`` (label -> attempts, exited, busy_seconds, busy_share, quarantined),
    ``lanes`` (label -> bars), ``failures``, ``not_done``, ``quarantined``."""
    reader = RunReader(paths)
    found = _Slots()
    for state, _, desc in reader.everything():
        found.add(state, desc)
    summary = read_summary(paths)
    redactor = redactor.including(values=found.secrets)
    labels = {*slots, *reader.slot_ids(), *found.stats, *found.bars}
    every = [b for bars in found.bars.values() for b in bars]
    t0 = min((b.start for b in every), default=None)
    t1 = max((b.end for b in every), default=None)
    span = (t1 - t0) if t0 is not None and t1 is not None else 0.0
    marks = quarantine_marks(paths, summary)
    out_slots: dict[str, SlotShare] = {}
    busy_all = 0.0
    for label in labels:
        bars = sorted(found.bars.get(label, []), key=lambda b: b.start)
        busy = merged_seconds((b.start, b.end) for b in bars)
        busy_all += busy
        stats = found.stats.get(label, {"attempts": 0, "exited": 0})
        out_slots[label] = {
            "attempts": stats["attempts"],
            "exited": stats["exited"],
            "busy_seconds": round(busy, 3),
            "busy_share": round(busy / span, 4) if span > 0 else (1.0 if bars else 0.0),
            "quarantined": marks.get(label),
        }
        found.bars[label] = bars[-MAX_BARS:]
    capacity = span * len(labels)
    return {
        "window": [t0, t1] if t0 is not None and t1 is not None else None,
        "busy_share": round(busy_all / capacity, 4) if capacity > 0 else None,
        "slots": out_slots,
        "lanes": {label: found.bars.get(label, []) for label in labels},
        "failures": _failures(summary if summary else {"failures": found.failures}, redactor),
        "not_done": _count(summary.get("not_done")) if summary else found.not_done,
        "quarantined": [_shown(q, redactor) for q in _quarantines(paths, summary)],
        "summary": bool(summary),
    }


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _listed(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _failures(summary: Mapping[str, object], redactor: Redactor) -> list[FailureJson]:
    out: list[FailureJson] = []
    for f in _listed(summary.get("failures"))[:MAX_FAILURES]:
        if isinstance(f, dict):
            entry = TaskRow.from_json(f)
            out.append(
                {
                    "task": inert(entry.task),
                    "state": entry.state,
                    "reason": inert(redactor.text(entry.reason)),
                }
            )
    return out


def _quarantines(paths: RunPaths, summary: Mapping[str, object]) -> list[Mapping[str, object]]:
    """The summary's record of quarantined slots (lifted ones too); without a summary, the
    run's quarantine files (a run that ended without writing one)."""
    found = _listed(summary.get("quarantined")) if summary else RunReader(paths).quarantines()
    return [q for q in found if isinstance(q, dict) and q.get("slot")]


def _shown(q: Mapping[str, object], redactor: Redactor) -> ShownQuarantine:
    return {
        "slot": str(q.get("slot")),
        "gpus": [g for g in _listed(q.get("gpus")) if isinstance(g, int)],
        "reason": inert(redactor.text(str(q.get("reason") or ""))),
        "lifted": inert(redactor.text(str(q["lifted"]))) if q.get("lifted") else None,
    }


def quarantine_marks(paths: RunPaths, summary: Mapping[str, object]) -> dict[str, str]:
    """Slot -> its badge: "quarantined" (still out at the end) or "was quarantined"."""
    out: dict[str, str] = {}
    for q in _quarantines(paths, summary):
        out[str(q["slot"])] = "was quarantined" if q.get("lifted") else "quarantined"
    return out


class FinalCache:
    """An ended run's :func:`final_view`, read again when its key (summary, journal) changes.
    A small run's is read at once; a large one's (every descriptor: seconds for 100,000 tasks)
    in a thread, so that the page paints first and the run's view follows (:meth:`fresh`)."""

    def __init__(self, paths: RunPaths, redactor: Redactor) -> None:
        self.paths, self.redactor = paths, redactor
        self.lock = threading.Lock()
        self._key: Any = None
        self._view: FinalView | None = None
        self._reading: Any = None  # the key a thread reads now
        self._fresh = False

    def get(self, key: Any, tasks: int, slots: Iterable[str]) -> FinalView | None:
        """The view for ``key``: None while a thread reads it (the older one is never shown:
        it may say another state)."""
        with self.lock:
            if self._key == key:
                return self._view
            if tasks > SYNC_TASKS:
                if self._reading != key:
                    self._reading = key
                    labels = list(slots)
                    threading.Thread(
                        target=self._read, args=(key, labels), name="final-view", daemon=True
                    ).start()
                return None
        view = final_view(self.paths, self.redactor, slots)
        with self.lock:
            self._key, self._view = key, view
        return view

    def _read(self, key: Any, slots: list[str]) -> None:
        view = final_view(self.paths, self.redactor, slots)
        with self.lock:
            if self._reading == key:
                self._key, self._view, self._fresh = key, view, True

    def fresh(self) -> bool:
        """Whether a thread's read ended since the last call (the pages are then told)."""
        with self.lock:
            fresh, self._fresh = self._fresh, False
        return fresh
