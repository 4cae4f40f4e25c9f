"""The run page's task table, paged on the server: fast with 100,000 tasks.

The index is the queue folders' names, listed once (a name holds the task's id, priority and
submission order; no descriptor is read), then kept up to date by the journal's events (started,
finished, requeued, control, recovered) as the hub folds them. Only the rows of the page asked
for are read (``RunReader.read``, at most ``MAX_LIMIT`` descriptors). Tasks appended by ``add``
or set aside as corrupt make the index list the folders again, at most once a second.

Names: a task's display name lives in its descriptor; the index learns the names of the rows it
has shown, and a background pass (:meth:`TaskIndex.learn_names`) reads the others once, so that
sorting and searching by name work on the whole run once it has finished.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from gpuswarm.core.events import WAITING, Control, Event, Finished, Other, Recovered, Requeued
from gpuswarm.core.events import Started as StartedEvent
from gpuswarm.core.models import State, base_name
from gpuswarm.core.redact import SHAPES, Redactor, inert
from gpuswarm.dashboard.payloads import TaskLine, TaskPage
from gpuswarm.outputs.results import row_for
from gpuswarm.store.names import PRIORITY_LIMIT, descriptor_name, task_id_of
from gpuswarm.store.reader import RunReader

MAX_LIMIT = 200
RELIST_SECONDS = 1.0
SORTS = ("order", "id", "name", "state")
STATE_ORDER = {s.value: i for i, s in enumerate(State)}


@dataclass(slots=True)
class Entry:
    id: str
    state: str  # its queue folder's state
    base: str  # its descriptor name without a lease: <rank><seq>_<id>.json
    name: str | None = None  # learned from its descriptor
    waiting: bool = False  # a retry waiting out its backoff (in running/, counted pending)


class TaskIndex:
    """Task id -> where it is; pages of it sorted and filtered (thread-safe)."""

    def __init__(self, reader: RunReader, redactor: Redactor = SHAPES) -> None:
        self.redactor = redactor
        self.reader = reader
        self.lock = threading.Lock()
        self.entries: dict[str, Entry] | None = None  # None until the first page is asked for
        self.version = 0
        self._stale = False
        self._listed = 0.0
        self._order: tuple[tuple[Any, ...], list[str]] | None = None
        self.names_known = False
        self._learning = False

    def warm(self) -> None:
        """List the folders and sort them in the queue's order now (a background thread when
        the dashboard finds the run), so that the first page asked for is ready."""
        self.page(limit=1)

    # -- keeping it true -----------------------------------------------------------------------
    def _list(self) -> dict[str, Entry]:
        entries: dict[str, Entry] = {}
        for state in State:
            for name in self.reader.names(state):
                tid = task_id_of(name)
                if tid not in entries:
                    entries[tid] = Entry(tid, state.value, base_name(name))
        old = self.entries or {}
        for tid, entry in entries.items():
            known = old.get(tid)
            if known is not None:
                entry.name = known.name
        return entries

    def _ensure(self) -> dict[str, Entry]:
        if self.entries is None or (
            self._stale and time.monotonic() - self._listed >= RELIST_SECONDS
        ):
            self.entries = self._list()
            if any(e.name is None for e in self.entries.values()):
                self.names_known = False  # tasks added since the names were read
            self._listed = time.monotonic()
            self._stale = False
            self.version += 1
        return self.entries

    def apply(self, e: Event) -> None:
        """One journal event (the hub calls this for every line it folds)."""
        with self.lock:
            if self.entries is None:
                return
            if isinstance(e, Other):
                if e.name in ("added", "corrupt"):
                    self._stale = True
                return
            moved = self._moved(e)
            if moved is None:
                return
            task, state, waiting = moved
            entry = self.entries.get(task)
            if entry is None:
                self._stale = True
                return
            entry.state, entry.waiting = state, waiting
            if isinstance(e, Control) and e.request == "priority" and e.priority is not None:
                seq = entry.base[4:13]
                if seq.isdigit() and -PRIORITY_LIMIT <= e.priority <= PRIORITY_LIMIT:
                    entry.base = descriptor_name(e.priority, int(seq), task)
            self.version += 1

    @staticmethod
    def _moved(e: Event) -> tuple[str, str, bool] | None:
        """(task, its queue state now, waiting) when ``e`` moved a task."""
        if isinstance(e, StartedEvent):
            return e.task, State.RUNNING.value, False
        if isinstance(e, Finished) and e.state is not None:
            if e.state == WAITING:
                return e.task, State.RUNNING.value, True
            return e.task, e.state, False
        if isinstance(e, Requeued) and e.task is not None:
            return e.task, State.PENDING.value, False
        if isinstance(e, Recovered) and e.task is not None and e.state is not None:
            return e.task, e.state, False
        if isinstance(e, Control) and e.task is not None and e.state is not None:
            return e.task, e.state, False
        if isinstance(e, Control) and e.task is not None and e.request == "priority":
            return e.task, State.PENDING.value, False
        return None

    # -- pages ---------------------------------------------------------------------------------
    def page(
        self,
        *,
        state: str | None = None,
        sort: str = "order",
        descending: bool = False,
        offset: int = 0,
        limit: int = 50,
        query: str = "",
    ) -> TaskPage:
        """One page of the table: ``total`` (matching rows), ``offset`` and the ``rows``."""
        limit = max(1, min(MAX_LIMIT, limit))
        query = query.strip().lower()
        if (sort == "name" or query) and not self.names_known:
            self._learn_in_background()
        with self.lock:
            entries = self._ensure()
            key = (self.version, state, sort, descending, query)
            if self._order is not None and self._order[0] == key:
                ids = self._order[1]
            else:
                ids = self._sorted(entries, state, sort, descending, query)
                self._order = (key, ids)
            total = len(ids)
            offset = max(0, min(offset, max(0, total - 1)))
            chosen = [entries[t] for t in ids[offset : offset + limit]]
        rows = self._rows(chosen)
        return {
            "total": total,
            "offset": offset,
            "limit": limit,
            "rows": rows,
            "names_known": self.names_known,
        }

    def _sorted(
        self,
        entries: dict[str, Entry],
        state: str | None,
        sort: str,
        descending: bool,
        query: str,
    ) -> list[str]:
        found = [
            e
            for e in entries.values()
            if (state is None or _state_of(e) == state)
            and (not query or query in e.id.lower() or (e.name and query in e.name.lower()))
        ]
        if sort == "id":
            found.sort(key=lambda e: e.id, reverse=descending)
        elif sort == "name":
            found.sort(key=lambda e: ((e.name or "").lower(), e.id), reverse=descending)
        elif sort == "state":
            found.sort(key=lambda e: (STATE_ORDER.get(e.state, 99), e.base), reverse=descending)
        else:  # the queue's order: priority, then submission
            found.sort(key=lambda e: e.base, reverse=descending)
        return [e.id for e in found]

    def _rows(self, chosen: list[Entry]) -> list[TaskLine]:
        leased: dict[str, str] | None = None
        rows: list[TaskLine] = []
        for entry in chosen:
            state = State(entry.state) if entry.state in STATE_ORDER else State.FAILED
            file = entry.base
            if state is State.RUNNING:
                if leased is None:
                    leased = {task_id_of(n): n for n in self.reader.names(State.RUNNING)}
                file = leased.get(entry.id, entry.base)
            desc = self.reader.read(state, file)
            if desc is None:  # moved on since (the journal will say where): shown as known
                rows.append(
                    {
                        "id": entry.id,
                        "name": entry.name or "",
                        "state": _state_of(entry),
                        "moving": True,
                    }
                )
                with self.lock:
                    self._stale = True
                continue
            desc.default_id(entry.id)
            values = row_for(state, desc).values
            entry.name = desc.name
            rows.append(
                {
                    "id": entry.id,
                    "name": inert(self.redactor.name(desc.name)),
                    "state": _state_of(entry),
                    "priority": desc.priority,
                    "attempts": values.attempts,
                    "max_attempts": desc.max_attempts,
                    "seconds": values.seconds,
                    "exit": values.exit,
                    "reason": inert(self.redactor.text(values.reason))[:300],
                }
            )
        return rows

    def _learn_in_background(self) -> None:
        with self.lock:
            if self._learning:
                return
            self._learning = True
        threading.Thread(target=self.learn_names, name="task-names", daemon=True).start()

    def learn_names(self, budget: float = 60.0) -> None:
        """Read every descriptor's name once (a background thread: sorting and searching by
        name then cover the whole run). Gives up after ``budget`` seconds (asked again later)."""
        deadline = time.monotonic() + budget
        names: dict[str, str] = {}
        complete = True
        try:
            with self.lock:
                entries = self._ensure()
                todo = {(e.state, e.base) for e in entries.values() if e.name is None}
            for state in State:
                wanted = {base for st, base in todo if st == state.value}
                for name, desc in self.reader.descriptors(state) if wanted else ():
                    if base_name(name) in wanted:
                        names[task_id_of(name)] = desc.name
                    if time.monotonic() > deadline:
                        complete = False
                        break
                if not complete:
                    break
        finally:
            with self.lock:
                for tid, name in names.items():
                    entry = (self.entries or {}).get(tid)
                    if entry is not None:
                        entry.name = name
                self.names_known = complete
                self._learning = False
                self.version += 1


def _state_of(entry: Entry) -> str:
    return State.PENDING.value if entry.waiting else entry.state
