"""Groups (issue 35): a task's ``group:`` (a glob or matrix entry's by default), their progress
for ``gpuswarm status --group NAME`` (counts per state, percent ended, ETA) and report.html.

The tally folds descriptors one at a time (the report's one pass over the queue, or status's):
nothing is kept per task. The ETA is the group's remaining tasks at the rate its tasks ended so
far (ended ones over the time since its first attempt started); None until one ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from gpuswarm.core.errors import BadInputError
from gpuswarm.core.models import Descriptor, State
from gpuswarm.outputs.html import html_table
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.runs import open_run

_ENDED_VALUES = frozenset(s.value for s in State.terminal())  # the counts' keys


class GroupProgress(TypedDict):
    """A group's line of the progress table (``status --group``, the dashboard, /metrics)."""

    counts: dict[str, int]
    total: int
    ended: int
    percent: float  # of total
    eta_seconds: float | None


@dataclass
class _Group:
    counts: dict[str, int] = field(default_factory=dict)
    first_start: float | None = None
    last_end: float | None = None


@dataclass
class GroupTally:
    """Per group: how many tasks in each state, when its first attempt started."""

    groups: dict[str, _Group] = field(default_factory=dict)

    def add(self, state: State, desc: Descriptor) -> None:
        name = desc.group
        if name is None:
            return
        group = self.groups.setdefault(name, _Group())
        group.counts[state.value] = group.counts.get(state.value, 0) + 1
        for attempt in desc.attempts:
            started, ended = attempt.started, attempt.ended
            if started is not None and (group.first_start is None or started < group.first_start):
                group.first_start = float(started)
            if ended is not None and (group.last_end is None or ended > group.last_end):
                group.last_end = float(ended)

    def table(self, now: float | None = None) -> dict[str, GroupProgress]:
        """Group -> ``counts``, ``total``, ``ended``, ``percent`` (of total), ``eta_seconds``."""
        now = time.time() if now is None else now
        out: dict[str, GroupProgress] = {}
        for name in sorted(self.groups):
            g = self.groups[name]
            total = sum(g.counts.values())
            ended = sum(n for s, n in g.counts.items() if s in _ENDED_VALUES)
            eta = None
            if 0 < ended < total and g.first_start is not None:
                rate = ended / max(1e-6, now - g.first_start)
                eta = round((total - ended) / rate, 1)
            out[name] = {
                "counts": dict(sorted(g.counts.items())),
                "total": total,
                "ended": ended,
                "percent": round(100.0 * ended / total, 1) if total else 100.0,
                "eta_seconds": 0.0 if ended == total else eta,
            }
        return out


def tally_run(folders: QueueFolders) -> GroupTally:
    """One pass over every descriptor of the run."""
    tally = GroupTally()
    for state in State:
        for _, desc in folders.iter_descs(state):
            tally.add(state, desc)
    return tally


class GroupCache:
    """Every group's progress (:meth:`GroupTally.table`) for pages and scrapes that ask often
    (the dashboard's run page, ``/metrics``): taken again at most every ``seconds``, in a
    thread of its own (a run of 100,000 tasks is 100,000 reads), the last table returned
    meanwhile (the first one of a run of up to ``SYNC_TASKS`` tasks is taken at once, a
    larger run's is ``{}`` until it is ready); ``{}`` for a run with no groups."""

    SYNC_TASKS = 5_000

    def __init__(self, folders: QueueFolders, seconds: float = 5.0) -> None:
        self.folders = folders
        self.seconds = seconds
        self._first: dict[str, GroupProgress] = {}
        self._table = self._first
        self._taken = -seconds
        self._busy = False
        self._lock = threading.Lock()

    def get(self) -> dict[str, GroupProgress]:
        now = time.monotonic()
        with self._lock:
            start = not self._busy and now - self._taken >= self.seconds
            if start:
                self._busy, self._taken = True, now
            table = self._table
        if not start:
            return table
        first = table is self._first
        if first and sum(self.folders.counts().values()) <= self.SYNC_TASKS:
            self._take()
            return self._table
        threading.Thread(target=self._take, name="group-tally", daemon=True).start()
        return table

    def _take(self) -> None:
        try:
            table = tally_run(self.folders).table()
        except OSError:
            table = None  # a run folder going away: the last table stays
        with self._lock:
            if table is not None:
                self._table = table
            self._busy = False


class GroupStatus(TypedDict, total=False):
    """``status --group [NAME] --json``: every group's table, or one group's line."""

    run: str
    groups: dict[str, GroupProgress]  # without NAME
    group: str  # with NAME: its line's keys follow
    counts: dict[str, int]
    total: int
    ended: int
    percent: float
    eta_seconds: float | None


def group_status(run_dir: Path, group: str | None = None) -> GroupStatus:
    """``gpuswarm status --group NAME``: that group's progress (every group's without one);
    an unknown group is a BadInputError (exit 2) naming the run's groups."""
    paths, _ = open_run(run_dir)
    table = tally_run(QueueFolders(paths)).table()
    if group is None:
        return {"run": str(paths.root), "groups": table}
    if group not in table:
        known = ", ".join(table) or "none"
        raise BadInputError(f"no group {group!r} in {paths.root} (its groups: {known})")
    g = table[group]
    return {
        "run": str(paths.root),
        "group": group,
        "counts": g["counts"],
        "total": g["total"],
        "ended": g["ended"],
        "percent": g["percent"],
        "eta_seconds": g["eta_seconds"],
    }


def groups_section(table: Mapping[str, Mapping[str, Any]]) -> str:
    """report.html's "Groups" section ("" when the run has none)."""
    if not table:
        return ""
    rows = []
    for name, g in table.items():
        counts = ", ".join(f"{s} {n}" for s, n in g["counts"].items())
        eta = g["eta_seconds"]
        rows.append(
            {
                "group": name,
                "ended": f"{g['ended']}/{g['total']}",
                "progress": f"{g['percent']:.1f}%",
                "states": counts,
                "ETA": "" if eta is None else f"{eta:.0f}s",
            }
        )
    head = "<h2>Groups</h2>\n<p class=note>per group: tasks ended of all, by state</p>\n"
    return head + html_table(("group", "ended", "progress", "states", "ETA"), rows) + "\n"


def group_lines(table: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per group for the terminal: ``agent  12/426 (2.8%)  done 10 failed 2``."""
    out = []
    for name, g in table.items():
        counts = "  ".join(f"{s} {n}" for s, n in g["counts"].items())
        eta = g["eta_seconds"]
        tail = "" if eta is None or g["ended"] == g["total"] else f"  ETA {eta:.0f}s"
        out.append(f"{name}  {g['ended']}/{g['total']} ({g['percent']:.1f}%)  {counts}{tail}")
    return out
