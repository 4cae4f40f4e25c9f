"""RunReader: the one reader of a run's folders, for every view of a run.

``status``, ``watch``, the live view, the report and timeline, ``check`` and the research views
read a run through it: descriptors by state, what runs where (the leases of running/), the
attempt folders and logs, the quarantine files, and a snapshot :class:`RunView` that the journal
then updates. It only reads (the queue module owns every transition).

One rule per question, so two views never disagree: the attempt a running task is on is
:func:`attempt_number`; a task in running/ that only waits out a retry backoff (``retry_at``) is
*waiting*: no slot runs it and it counts as pending, as the journal's ``finished ... waiting``
says (a watch started during a backoff used to count it as running and show the log of an
attempt that had not started).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuswarm.core.events import Event, SupervisorStarted, decode
from gpuswarm.core.models import Descriptor, State, base_name
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView, SlotRow
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.leases import is_live, registered_slot_ids, slot_host, slot_label
from gpuswarm.store.ledger import read_events, tail_events
from gpuswarm.store.names import lease_of, task_id_of
from gpuswarm.store.quarantines import read_quarantines
from gpuswarm.store.spool import spooled_ids

#: A watch reads the whole journal for the slot list only when it is smaller than this.
SLOTS_SCAN_BYTES = 8 << 20
HELD_SCAN_BYTES = 256 << 20  # gpu_held lines are looked for in this much of the journal


def attempt_number(desc: Descriptor) -> int:
    """The number of the attempt a running descriptor is on (the one rule, shared by status and
    watch): every attempt recorded so far, interrupted ones included, plus one, as the
    supervisor numbers them. Its log is ``attempt-<n>/output.log``."""
    return desc.next_attempt


def last_attempt(desc: Descriptor, *, started: bool = False) -> int | None:
    """The number of the newest recorded attempt (``started``: the newest that ran, i.e. has a
    start time and so a log); None when there is none."""
    for att in reversed(desc.attempts):
        if not started or att.was_launched:
            return att.n
    return None


@dataclass(frozen=True)
class Running:
    """A task in running/: who holds it, on which slot, which attempt, since when."""

    file: str  # its name in running/ (with the lease)
    task: str
    desc: Descriptor | None = field(repr=False)  # None when unreadable
    owner: str | None
    slot: str | None  # the slot label, unique in the run; None without a lease
    attempt: int
    since: float  # the claim time (the file's mtime)
    log: Path | None  # the running attempt's log; None while waiting or without an id
    retry_at: float | None  # set while a retry waits out its backoff
    node: str | None = None  # the host of a cluster's slot (not the supervisor's)
    # its attempt has ended and the outcome is being committed: its slot claimed the next task
    # already (a newer claim holds the same slot); it runs nowhere (issue 28)
    ending: bool = False

    @property
    def waiting(self) -> bool:
        return self.retry_at is not None

    @property
    def name(self) -> str:
        return self.desc.name if self.desc is not None else ""

    @property
    def timeout(self) -> float | None:
        return self.desc.timeout if self.desc is not None else None

    @property
    def host(self) -> str | None:
        """Where it runs: its slot's node (a cluster's), else its supervisor's host."""
        if self.node:
            return self.node
        return self.owner.split(":", 1)[0] if self.owner else None


class RunReader:
    """Reads one run's folders (never writes); cheap to make, nothing is cached."""

    def __init__(self, paths: RunPaths, folders: QueueFolders | None = None) -> None:
        self.paths = paths
        self.folders = folders if folders is not None else QueueFolders(paths)

    # -- descriptors ---------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Descriptors per state folder (one listing each); a streamed enqueue's tasks not yet
        in pending/ count as pending (store/spool.py: one stat when there is no spool)."""
        out = {s.value: n for s, n in self.folders.counts().items()}
        if self.paths.enqueue_spool.exists():
            out[State.PENDING.value] += len(spooled_ids(self.paths))
        return out

    def names(self, state: State) -> list[str]:
        return self.folders.names(state)

    def read(self, state: State, name: str) -> Descriptor | None:
        """A descriptor; None when unreadable (``records.why_unreadable`` says why)."""
        return self.folders.read_desc(state, name)

    def holds(self, state: State, name: str) -> bool:
        """Whether ``name`` is still in ``state``'s folder (one stat: every move renames)."""
        return (self.paths.state_dir(state.value) / name).exists()

    def descriptors(self, state: State) -> Iterator[tuple[str, Descriptor]]:
        """``(file name, descriptor)`` of each readable descriptor in ``state``, in name order."""
        return self.folders.iter_descs(state)

    def everything(self) -> Iterator[tuple[State, str, Descriptor]]:
        """Every readable descriptor of every state folder."""
        for state in State:
            for name, data in self.descriptors(state):
                yield state, name, data

    def latest(self, state: State, limit: int) -> list[tuple[str, Descriptor | None]]:
        """The ``limit`` descriptors of ``state`` moved there last (newest first); an unreadable
        one comes back as None."""
        folder = self.paths.state_dir(state.value)
        with os.scandir(folder) as it:
            entries = [e for e in it if not e.name.startswith(".")]
        entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
        return [(e.name, self.read(state, e.name)) for e in entries[:limit]]

    def empty_descriptors(self, states: tuple[State, ...]) -> dict[str, int]:
        """Descriptors truncated to 0 bytes, per state folder (one stat each: cheap for ``ls``;
        other damage is found by ``check``, ``report`` and the end-of-run summary)."""
        out: dict[str, int] = {}
        for state in states:
            with os.scandir(self.paths.state_dir(state.value)) as it:
                n = sum(1 for e in it if not e.name.startswith(".") and e.stat().st_size == 0)
            if n:
                out[state.value] = n
        return out

    def corrupt(self, *, visible: bool = False) -> list[str]:
        """The files set aside in corrupt/, sorted (``visible``: without dot files)."""
        try:
            names = os.listdir(self.paths.corrupt)
        except OSError:
            return []
        return sorted(n for n in names if not (visible and n.startswith(".")))

    def task_id(self, name: str, desc: Descriptor | None) -> str:
        """The task's id: its descriptor's, else the one its file name carries."""
        if desc is not None and desc.has_id:
            return desc.id
        return task_id_of(base_name(name))

    # -- attempts ------------------------------------------------------------------------------
    def last_log(self, task_id: str, desc: Descriptor, *, started: bool = False) -> Path | None:
        """The log of the newest recorded attempt (``started``: of the newest that ran)."""
        n = last_attempt(desc, started=started)
        return None if n is None else self.paths.attempt_log(task_id, n)

    def attempt_numbers(self, task_id: str) -> list[int]:
        """The numbers of the task's attempt folders on disk (``attempt-<n>/``), ascending:
        every attempt that was launched, lost ones (their supervisor died) included."""
        try:
            with os.scandir(self.paths.task_dir(task_id)) as it:
                names = [e.name for e in it if e.name.startswith("attempt-")]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(int(n[8:]) for n in names if n[8:].isdigit() and n[8] != "0")

    # -- what runs where -----------------------------------------------------------------------
    def running(self) -> list[Running]:
        """Every task in running/, by slot label (those without a lease last)."""
        out = []
        folder = self.paths.state_dir(State.RUNNING.value)
        for name in self.names(State.RUNNING):
            try:
                since = (folder / name).stat().st_mtime
            except FileNotFoundError:
                continue  # moved on meanwhile
            out.append(self._running(name, since))
        out.sort(key=lambda r: (r.slot is None, r.slot or "", r.since))
        newest = {r.slot: r for r in out if r.slot is not None and not r.waiting}  # one a slot
        return [
            replace(r, ending=True) if not r.waiting and newest.get(r.slot or "", r) is not r else r
            for r in out
        ]

    def _running(self, name: str, since: float) -> Running:
        desc = self.read(State.RUNNING, name)
        lease = lease_of(name)
        attempt = attempt_number(desc) if desc is not None else 1
        retry_at = desc.retry_at if desc is not None else None
        log = None
        if desc is not None and desc.has_id and retry_at is None:
            log = self.paths.attempt_log(desc.id, attempt)
        slot = slot_label(self.paths, *lease) if lease else None
        return Running(
            file=name,
            task=self.task_id(name, desc),
            desc=desc,
            owner=lease[0] if lease else None,
            slot=slot,
            attempt=attempt,
            since=since,
            log=log,
            retry_at=retry_at,
            node=slot_host(self.paths, slot) if slot and lease else None,
        )

    def slot_ids(self) -> list[str]:
        """Every slot id the run has had (the timeline's lanes), [] for runs made before ids."""
        return registered_slot_ids(self.paths)

    def quarantines(self) -> list[dict[str, Any]]:
        return read_quarantines(self.paths)

    def live(self) -> bool:
        return is_live(self.paths)

    # -- the journal ---------------------------------------------------------------------------
    def tail(self) -> list[Event]:
        """The typed events of the journal's last MiB (cheap on huge runs)."""
        return [e for raw in tail_events(self.paths.events) if (e := decode(raw)) is not None]

    def slot_labels(self) -> list[str]:
        """The slots every supervisor of the run announced (when the journal is small)."""
        try:
            size = self.paths.events.stat().st_size
        except FileNotFoundError:
            return []
        labels: list[str] = []
        for raw in read_events(self.paths.events) if size < SLOTS_SCAN_BYTES else []:
            event = decode(raw)
            if isinstance(event, SupervisorStarted):
                labels += [s for s in event.slots if s not in labels]
        return labels

    def held_gpus(self) -> dict[int, str]:
        """GPUs an ended attempt still holds (issue 19: ``gpu_held`` not followed by a
        ``gpu_freed``) -> why; from the journal's lines that name them (bounded read)."""
        return self._gpu_view().held_gpus

    def waiting_for_gpu(self) -> dict[str, str]:
        """Pending tasks that were first in line and fit no GPU (``gpu_wait``) -> why."""
        pending = {task_id_of(base_name(n)) for n in self.names(State.PENDING)}
        waits = self._gpu_view().waiting_room
        return {task: why for task, why in waits.items() if task in pending}

    def _gpu_view(self) -> RunView:
        view = RunView({})
        try:
            with self.paths.events.open("rb") as f:
                data = f.read(HELD_SCAN_BYTES)
        except OSError:
            return view
        for line in data.split(b"\n"):
            if b'"gpu_held"' in line or b'"gpu_freed"' in line or b'"gpu_wait"' in line:
                with contextlib.suppress(ValueError):
                    view.apply(json.loads(line))
        return view

    def view(self) -> RunView:
        """A :class:`RunView` of the run as its folders stand now (one look, when a watch
        starts); the journal's new lines then keep it up to date."""
        counts = self.counts()
        view = RunView(counts)
        for label in self.slot_labels():
            view.slots.setdefault(label, SlotRow())
        for r in self.running():
            if r.ending:  # its outcome is being committed: the journal moves it on
                continue
            if r.waiting:  # its next attempt has not started: pending, as the journal says
                counts[State.RUNNING.value] -= 1
                counts[State.PENDING.value] += 1
                continue
            view.slots[r.slot or "?"] = SlotRow(
                task=r.task, name=r.name, attempt=r.attempt, since=r.since, timeout=r.timeout
            )
            view.seen_running[r.task] = r.attempt  # its start line may come after this look
        for q in self.quarantines() if self.live() else []:
            view.quarantined[str(q.get("slot"))] = str(q.get("reason", ""))
        return view
