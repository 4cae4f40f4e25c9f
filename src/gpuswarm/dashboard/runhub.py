"""One run as the dashboard shows it: a :class:`~gpuswarm.ui.watch.Follower` (the folders read
once, then only the journal's new lines folded by the one reducer, RunView), the recent attempts
of each slot for the Gantt chart, and the snapshot / update messages its pages get.

Nothing here scans a folder per update: a tick costs one ``stat`` of events.jsonl (and, for a
live run with clients, a 4 KiB tail read of each running attempt's log for its last line). The
journal offset after the last folded line is the position every message carries (the SSE event
id), so a page that reconnects gets exactly the events it missed (:meth:`RunHub.since`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuswarm.core.events import (
    Control,
    Finished,
    decode,
    kind_of,
)
from gpuswarm.core.logs import log_tail
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import Redactor, inert
from gpuswarm.core.runview import RunView, SlotRow
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.dashboard.finished import FinalCache
from gpuswarm.dashboard.gpustats import GpuStats
from gpuswarm.dashboard.lanes import BARS_PER_LANE, Bar, add_event, natural
from gpuswarm.dashboard.lanes import outcome_of as outcome_of
from gpuswarm.dashboard.lanes import slot_place as slot_place
from gpuswarm.dashboard.payloads import (
    FinalView,
    RunHeader,
    RunSnapshot,
    RunUpdate,
    RunViewJson,
    SlotLine,
    Spent,
    without_lanes,
)
from gpuswarm.dashboard.taskindex import TaskIndex
from gpuswarm.outputs.groups import GroupCache
from gpuswarm.outputs.results import shown_counts
from gpuswarm.outputs.slurmview import slurm_lines, slurm_view
from gpuswarm.outputs.status import run_state
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.leases import host_slug
from gpuswarm.store.ledger import read_range
from gpuswarm.store.runs import open_run
from gpuswarm.ui.terminal import paused_now
from gpuswarm.ui.watch import Follower

RING_EVENTS = 5000  # recent events kept for reconnecting pages
RESUME_BYTES = 8 << 20  # a page further behind than this gets a fresh snapshot
FEED_EVENTS = 200  # events a snapshot carries for the page's event feed
LIVE_CHECK_SECONDS = 1.0
ENDED_CHECK_SECONDS = 5.0
# events after which a page gets every lane again (a resumed run's lanes are the journal's)
EVERY_LANE = ("requeued", "supervisor_stopped", "supervisor_started")


def public_event(raw: Mapping[str, object], redactor: Redactor) -> dict[str, object]:
    """A journal line (any JSON object: a later version's fields too) as a page gets it:
    strings redacted by the run's redactor (events hold no environments; a reason may quote
    a command line)."""
    out: dict[str, object] = redactor.tree(raw)
    return out


@dataclass
class _Batch:
    start: int
    end: int
    events: list[dict[str, object]] = field(default_factory=list)


class RunHub:
    """A run followed for the dashboard; thread-safe (``lock``): the server's poller calls
    :meth:`poll`, page requests read snapshots and task pages."""

    def __init__(self, run_id: str, paths: RunPaths, *, title: str = "") -> None:
        self.id = run_id
        self.paths = paths
        _, self.info = open_run(paths.root)
        self.title = title or str(self.info.get("name") or paths.root.name)
        # the one redactor of everything this run shows: this process's secrets, the
        # provisioned files' (run.json), and a task's own env where a page shows that task
        self.redactor = run_redactor(self.info)
        self.experiment = ""  # the id of the experiment whose core run this is
        self.watchers = 0  # pages following it now (their lanes' last lines are refreshed)
        self.lock = threading.RLock()
        self.follower = Follower(paths)
        self.view: RunView = self.follower.view
        self.position = self.follower.position
        self.lanes: dict[str, deque[Bar]] = {}
        self.feed: deque[dict[str, object]] = deque(maxlen=FEED_EVENTS)
        self._ring: deque[_Batch] = deque()
        self._ring_events = 0
        self.version = 0
        self.live = self.follower.reader.live()
        self.state = self._state()
        self._live_checked = time.monotonic()
        self._summary = _mtime(paths.summary_json)
        self.tasks = TaskIndex(self.follower.reader, self.redactor)
        threading.Thread(target=self.tasks.warm, name="task-index", daemon=True).start()
        self.gpus = GpuStats(str(self.info.get("vendor") or ""), host_slug())
        self._lines: dict[str, tuple[int, str]] = {}
        self._shown: dict[str, str] = {}
        self.paused = paused_now(paths)  # the pause flags (one listdir at most every 0.5 s)
        self.finals = FinalCache(paths, self.redactor)  # an ended run's view (report.html's)
        self.groups = GroupCache(QueueFolders(paths))  # issue 35: status --group's table
        self._seed()

    # -- start: the recent past from the journal's tail ----------------------------------------
    def _seed(self) -> None:
        """Bars and the feed from the journal's last MiB (the view itself came from the
        folders); done times for the ETA."""
        events = self.follower.reader.tail()
        for event in events:
            add_event(self.lanes, event, self.view.slots)
            if isinstance(event, Finished) and event.state == State.DONE.value and event.ts:
                self.view.finished_times.append(event.ts)
            self.feed.append(public_event(event.to_json(), self.redactor))
        if events and events[0].ts is not None and self.view.finished_times:
            self.view.started = min(events[0].ts, self.view.finished_times[0])
        running = {(label, row.task) for label, row in self.view.slots.items() if row.task}
        last = events[-1].ts if events and events[-1].ts else time.time()
        for label, bars in self.lanes.items():
            for bar in bars:
                if bar.end is None and (label, bar.task) not in running:
                    bar.end, bar.outcome = last, "interrupted"  # its end is older than the tail
        for label in self.view.slots:
            self.lanes.setdefault(label, deque(maxlen=BARS_PER_LANE))

    # -- following -----------------------------------------------------------------------------
    def poll(self) -> bool:
        """Fold what the journal gained since the last call; whether anything changed (the
        pages are then told). Costs one stat when nothing was appended."""
        changed = self.finals.fresh()  # an ended run's view was read in a thread
        if changed:
            with self.lock:
                self.version += 1
        now = time.monotonic()
        grew = self.follower.grew()
        # a live run is asked every second whether it still is; an ended one every 5 s, or at
        # once when its journal grows (a supervisor that starts writes supervisor_started)
        every = LIVE_CHECK_SECONDS if self.live else ENDED_CHECK_SECONDS
        if (grew and not self.live) or now - self._live_checked >= every:
            self._live_checked = now
            live = self.follower.reader.live()
            # an ended run's state may still change without a journal line (its summary.json
            # is written as its supervisor ends): looked at again with its liveness
            state = self.state
            summary = _mtime(self.paths.summary_json)
            if live != self.live or summary != self._summary:
                self._summary = summary
                state = self._state_of(live)
            if live != self.live or state != self.state:
                with self.lock:
                    self.live, self.state = live, state
                    self.version += 1
                changed = True
        if not grew:
            return changed
        with self.lock:
            start = self.position
            items = self.follower.poll()  # folded into the view by the one reducer
            batch = _Batch(start, self.follower.position)
            for event in items:
                if isinstance(event, dict):
                    continue  # a line of the wrong shape: skipped, as every reader does
                add_event(self.lanes, event, self.view.slots)
                self.tasks.apply(event)
                if isinstance(event, Control) and event.request in ("pause", "unpause"):
                    self.paused = paused_now(self.paths)  # read the flags again now
                shown = public_event(event.to_json(), self.redactor)
                batch.events.append(shown)
                self.feed.append(shown)
            self.position = batch.end
            if batch.end == start:
                return changed
            self._ring.append(batch)
            self._ring_events += len(batch.events)
            while self._ring_events > RING_EVENTS and len(self._ring) > 1:
                self._ring_events -= len(self._ring.popleft().events)
            self.state = self._state()
            self.version += 1
        return True

    def _state(self) -> str:
        return self._state_of(self.live)

    def _state_of(self, live: bool) -> str:
        with self.view.lock:
            counts = dict(self.view.counts)
        return run_state(self.paths, shown_counts(counts), live)

    # -- what pages get ------------------------------------------------------------------------
    def since(self, pos: int) -> tuple[int, list[dict[str, object]]] | None:
        """The events after journal offset ``pos`` up to now, and the offset they end at; None
        when ``pos`` cannot be resumed from (then a snapshot is sent)."""
        with self.lock:
            end = self.position
            if pos == end:
                return end, []
            if pos > end:
                return None
            ring = list(self._ring)
        if ring and pos >= ring[0].start:
            events = [e for b in ring if b.start >= pos for e in b.events]
            if any(b.start == pos for b in ring) or pos == ring[0].start:
                return end, events
        if end - pos > RESUME_BYTES:
            return None
        raws = read_range(self.paths.events, pos, end)
        if raws is None:
            return None
        return end, [public_event(r, self.redactor) for r in raws if decode(r) is not None]

    def header(self) -> RunHeader:
        """The run's line on the runs page: state, counts, progress, ETA."""
        with self.view.lock:
            counts = shown_counts(dict(self.view.counts))
            eta = self.view.eta(time.time()) if self.live else None
            note = self.view.note
            spent = _spent(self.view)
        total = sum(counts.values())
        ended = total - counts.get("pending", 0) - counts.get("running", 0)
        return {
            "id": self.id,
            "kind": "run",
            "title": self.title,
            "folder": self.paths.root.name,
            "path": str(self.paths.root),
            "created": self.info.get("created"),
            "state": self.state,
            "live": self.live,
            "counts": counts,
            "total": total,
            "progress": round(ended / total, 4) if total else 1.0,
            "eta": None if eta is None else round(eta, 1),
            "note": note,
            "spent": spent,  # issue 34: what the agents spent (None: none reported usage)
        }

    def view_json(self, *, lines: bool = True) -> RunViewJson:
        """The run page's live part: header, slots (task, attempt, since, timeout, last line,
        GPU use), pauses, quarantines, recent failures."""
        now = time.time()
        run_paused, paused_slots = self.paused()
        with self.view.lock:
            rows = {label: row for label, row in self.view.slots.items()}
            failures = [inert(self.redactor.text(f)) for f in self.view.failures]
            quarantined: dict[str, str | None] = dict(self.view.quarantined)
        stats = self.gpus.sample()
        final = None if self.live else self.final()
        done = {k: v["attempts"] for k, v in final["slots"].items()} if final else {}
        if final:  # every slot the run has had, its quarantine as the summary recorded it
            quarantined = {k: v["quarantined"] for k, v in final["slots"].items()}
        slots: list[SlotLine] = []
        for label in sorted({*rows, *done}, key=natural):
            row = rows.get(label) or SlotRow()
            host, gpus = slot_place(label)
            slots.append(
                {
                    "label": label,
                    "host": host,
                    "gpus": gpus,
                    "task": row.task,
                    "name": inert(self.redactor.name(row.name)),
                    "attempt": row.attempt,
                    "since": row.since if row.task else None,
                    "timeout": row.timeout if row.task else None,
                    "done": done.get(label, row.done),
                    "last_line": self._last_line(label, row.task, row.attempt) if lines else "",
                    "gpu": [stats[g] for g in gpus if g in stats] if host == self.gpus.host else [],
                    "paused": label in paused_slots,
                    "quarantined": quarantined.get(label),
                }
            )
        return {
            **self.header(),
            "now": now,
            "paused": run_paused,
            "slots": slots,
            "failures": failures,
            "slurm": slurm_lines(slurm_view(self.paths.root)),  # issue 36: jobs, allocation
            "nvml": self.gpus.works,
            "groups": self.groups.get(),  # group -> counts, total, ended, percent, eta_seconds
            "final": None if final is None else without_lanes(final),
        }

    def final(self) -> FinalView | None:
        """An ended run as report.html shows it (``finished.final_view``), read again when its
        summary or its journal changed; None while a large run's is being read."""
        with self.view.lock:
            tasks = sum(self.view.counts.values())
        with self.lock:
            labels = list(self.lanes)  # the poller may add one meanwhile
        return self.finals.get((self._summary, self.position, self.state), tasks, labels)

    def _lanes(self, labels: Iterable[str] | None = None) -> dict[str, list[Any]]:
        """The bars of ``labels`` (every lane when None): an ended run's every attempt from
        its descriptors, a live run's recent ones from the journal."""
        final = None if self.live else self.final()
        if final is not None:
            lanes: dict[str, list[Any]] = final["lanes"]
            return {k: v for k, v in lanes.items() if labels is None or k in labels}
        with self.lock:
            return {
                label: [b.as_json() for b in bars]
                for label, bars in self.lanes.items()
                if labels is None or label in labels
            }

    def snapshot(self) -> RunSnapshot:
        with self.lock:
            feed = list(self.feed)
            pos = self.position
        return {
            "pos": pos,
            "view": self.view_json(),
            "lanes": self._lanes(),
            "feed": feed,
            "settings": {"timeout_default": None},
        }

    def update(self, events: list[dict[str, object]], pos: int) -> RunUpdate:
        """What a page that is at an older position gets: the events it missed, the live view,
        and the lanes those events touched."""
        touched: set[str] | None = {str(e.get("slot")) for e in events if e.get("slot")}
        if not self.live or any(kind_of(e) in EVERY_LANE for e in events):
            touched = None  # every lane (an ended run's are its descriptors' attempts)
        view = self.view_json()
        return {"pos": pos, "events": events, "view": view, "lanes": self._lanes(touched)}

    def _last_line(self, label: str, task: str, attempt: int) -> str:
        """The running attempt's last output line (a 4 KiB tail, re-read when the log
        changed), redacted and with control characters visible."""
        if not task or attempt < 1:
            return ""
        log = self.paths.attempt_log(task, attempt)
        try:
            mtime = log.stat().st_mtime
        except (OSError, ValueError):
            return ""
        cached = self._lines.get(label)
        key = f"{task}\0{attempt}\0{mtime}"
        if cached is not None and cached[0] == hash(key):
            return cached[1]
        line = inert(self.redactor.text(log_tail(log, max_lines=1, max_bytes=4096).strip()))[:400]
        self._lines[label] = (hash(key), line)
        return line

    def lines_changed(self) -> bool:
        """Whether a running attempt's last output line changed since the last look (output
        makes no journal event: the poller asks this once a second while pages are open)."""
        with self.view.lock:
            rows = [(label, r.task, r.attempt) for label, r in self.view.slots.items() if r.task]
        now = {label: self._last_line(label, task, n) for label, task, n in rows}
        changed = now != self._shown
        self._shown = now
        return changed

    def log_of(self, task: str, attempt: int) -> Path:
        return self.paths.attempt_log(task, attempt)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def hubs_changed(hubs: Iterable[RunHub]) -> list[RunHub]:
    """Poll each hub once; those that changed."""
    return [h for h in hubs if h.poll()]


def _spent(view: RunView) -> Spent | None:
    """The run's spend as the journal says (issue 34): known USD, tokens, unknown attempts."""
    if not view.spent_tokens and not view.spent_usd and not view.spent_unknown:
        return None
    return {
        "cost_usd": round(view.spent_usd, 6),
        "tokens": view.spent_tokens,
        "cost_unknown_attempts": view.spent_unknown,
    }
