"""The small public facade over the core: create or open a run, submit and withdraw tasks, serve
a run (the supervisor), read what happened (task states, attempts, what runs where), resolve run
names.

Why a facade: research (and next the dashboard) are clients of the core. They must not know the
queue's file layout (descriptor names, lease suffixes, state folders), the run.json keys, the
engine's composition or the process backend: each of those may change behind this module
without touching a client. Every function here is a thin call into ``store``, ``engine`` and
``exec``; the names and the plain types they return (:class:`RunPaths`, :class:`TaskSpec`,
small frozen dataclasses) are the contract.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO, TypedDict

from gpuswarm.app.engine import supervise
from gpuswarm.app.output import Output
from gpuswarm.app.prepare import prepare
from gpuswarm.config.backends import plugins
from gpuswarm.config.models import TaskSpec, task_dump
from gpuswarm.core.errors import BackendError
from gpuswarm.core.models import AttemptRecord, base_name
from gpuswarm.core.models import State as TaskState
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.runview import RunView
from gpuswarm.exec.base import BackendOptions, backend_names, create_backend
from gpuswarm.exec.local import host_processes
from gpuswarm.outputs.runreport import RunReport
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store import runindex
from gpuswarm.store.folders import QueueFolders
from gpuswarm.store.ledger import read_events
from gpuswarm.store.names import task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.queuebase import note_added
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runinfo import RunInfo
from gpuswarm.store.runs import NewRun, latest_run, open_record
from gpuswarm.store.runs import create_run as _create_run

__all__ = [
    "Attempt",
    "GpuPlan",
    "RunPaths",
    "RunReport",
    "TaskRef",
    "TaskSpec",
    "TaskState",
    "check_backend",
    "create_run",
    "finished_ids",
    "has_pending",
    "kill_tree",
    "last_attempt",
    "latest_run",
    "plan_gpus",
    "processes_with_env",
    "read_journal",
    "remove_cut_writes",
    "resolve_run",
    "serve",
    "slot_count",
    "stop_processes",
    "submit",
    "task_states",
    "withdraw",
]


# -- creating and opening runs -----------------------------------------------------------------
@dataclass(frozen=True)
class GpuPlan:
    """The GPUs a ``--gpus`` spec names now and how many slots they give."""

    spec: str
    vendor: str
    ids: tuple[int, ...]
    slot_count: int
    names: tuple[str, ...] = ()  # each GPU's model, in ``ids`` order ("sim" when simulated)


def plan_gpus(
    spec: str,
    gpus_per_task: int = 1,
    tasks_per_gpu: int = 1,
    *,
    backend: str = "local",
    settings: Any = None,
) -> GpuPlan:
    """Discover the GPUs of ``spec`` (``auto``, ``0,1``, ``sim:4``); a bad spec raises the
    core's BadInputError before anything is written. A backend whose slots are its own (a
    cluster's, with its ``settings``): the GPUs of its nodes that ``spec`` admits (it joins the
    cluster to count them)."""
    if owns_slots(backend):
        cluster: Any = create_backend(backend, BackendOptions(settings=settings, gpus=spec))
        names = tuple(str(n) for n in cluster.gpu_names())
        count = max(1, len(names) // gpus_per_task * tasks_per_gpu)
        return GpuPlan(spec, "nvidia", tuple(range(len(names))), count, names)
    gpus = parse_gpu_spec(spec)
    slots = plan_slots(gpus, gpus_per_task, tasks_per_gpu)
    names = tuple(g.name for g in gpus.gpus)
    return GpuPlan(gpus.spec, gpus.vendor.value, gpus.ids, len(slots), names)


@dataclass(frozen=True)
class NewRunSpec:
    """A run with no tasks yet, made to be fed with :func:`submit` and run by :func:`serve`."""

    workspace: Path  # the run folder is made under it
    folder: str  # the run folder's name
    name: str  # the run's name in run.json
    base_dir: Path  # relative task paths start here
    gpus: GpuPlan
    source: str  # who made the run (shown by status)
    settings: Mapping[str, Any] = field(default_factory=dict)  # lease_ttl, retry_backoff, ...
    config: Mapping[str, Any] = field(default_factory=dict)  # recorded as the run's config


def check_backend(name: str, settings: Any, base_dir: Path) -> None:
    """Whether backend ``name`` can run attempts at all with its ``settings`` (a container
    backend: its daemon answers, the image is present, mount sources exist); the core's
    BadInputError otherwise."""
    if name not in backend_names():
        raise BackendError(f"unknown backend {name!r}; known: {', '.join(backend_names())}")
    create_backend(name, BackendOptions(settings=settings, base_dir=str(base_dir))).check()


def owns_slots(backend: str) -> bool:
    """Whether the backend makes its slots itself (a cluster's nodes join and leave)."""
    found = plugins().get(backend)
    return found is not None and found.owns_slots


def create_run(spec: NewRunSpec) -> RunPaths:
    """Create the run (staged, then one rename); its run.json is the one builder's
    (:class:`~gpuswarm.store.runinfo.RunInfo`), never a client's."""
    g = spec.gpus
    info = RunInfo(
        name=spec.name,
        workspace=spec.workspace,
        source=spec.source,
        base_dir=spec.base_dir,
        gpus=g.spec,
        vendor=g.vendor,
        gpu_ids=g.ids,
        slot_count=g.slot_count,
        settings=spec.settings,
        config=spec.config,
    )
    return _create_run(
        NewRun(name=spec.folder, workspace=spec.workspace, info=info.to_json(), tasks=[])
    )


def index_moved_run(run: Path, was: Path, name: str) -> None:
    """The run created at ``was`` now lives at ``run`` (moved with the folder it was staged
    in): the index of the user's runs points there, not at the staging path (pruned as gone,
    so ``ls``, ``status`` and ``dashboard`` never found an experiment's runs)."""
    runindex.forget(was)
    runindex.record(run, name)


def resolve_run(where: Path, workspace: Path = Path("runs")) -> Path:
    """The run folder meant by a run folder, a path inside one, or a bare run name (looked up
    under ``workspace``, then in the index of the user's runs)."""
    return runindex.resolve(where, workspace)


def slot_count(run: RunPaths) -> int:
    """How many slots the run has (one task each at a time): as planned, or for a cluster's
    run (a backend whose nodes join and leave) the slots its last supervisor has now,
    from the journal (as planned when none has started yet)."""
    _, info = open_record(run.root)
    planned = info.slot_count
    if not owns_slots(info.backend):
        return planned
    view = RunView({})
    for e in read_journal(run.events):
        view.apply(e)
    live = view.supervisor_slots
    return max(1, len(live)) if live else planned


# -- submitting and withdrawing ----------------------------------------------------------------
def submit(run: RunPaths, task: TaskSpec, seq: int) -> str:
    """Queue one task in a run that may be live (durably); live supervisors see it at their
    next claim. Returns the task's queue entry name."""
    return DirQueue.add_pending(run, task_dump(task), seq)


def withdraw(run: RunPaths, task_id: str) -> bool:
    """Take a queued task out before a supervisor claims it; False when it is not queued
    (claimed meanwhile, or never queued). A claim and this rename cannot both win."""
    return DirQueue(run).withdraw(task_id)


def cancel(run: RunPaths, task_id: str, reason: str) -> None:
    """Cancel a task (a queued one now, a running one by its supervisor within about a
    second; an ended one stays as it is): the queue verb ``gpuswarm cancel``'s."""
    from gpuswarm.app import (
        control as control_ops,  # the queue verbs: loaded by the one caller that cancels
    )

    control_ops.cancel_tasks(run.root, [task_id], reason=reason, wait=None)
    note_added(run)  # issue 38: live keepers apply it at their next quick look (0.25 s)


def remove_cut_writes(run: RunPaths) -> int:
    """Temp files among the queued tasks whose writer is dead (writes a crash cut short; a
    supervisor may be re-queueing an attempt right now). Returns how many went."""
    return DirQueue(run).remove_cut_writes()


class RunningTask(TypedDict):
    """Where a task in running/ runs: its slot ("?" without a lease), since when (its claim
    time), and the running attempt's output (None while it waits or has no id)."""

    slot: str
    since: float
    log: Path | None


def running(run: RunPaths) -> dict[str, RunningTask]:
    """Task id -> {slot, since, log} for the tasks in running/ (the read model's one rule: a
    task waiting out a retry backoff runs nowhere); ``log``: the running attempt's output."""
    return {
        r.task: {"slot": r.slot or "?", "since": r.since, "log": r.log}
        for r in RunReader(run).running()
    }


# -- reading outcomes --------------------------------------------------------------------------
class TaskRef(NamedTuple):
    """Where a task is now: its state and its queue entry (for :func:`last_attempt`)."""

    state: TaskState
    name: str


def task_states(run: RunPaths) -> dict[str, TaskRef]:
    """Task id -> its state and entry, for every task (one look per state)."""
    folders = QueueFolders(run)
    return {
        task_id_of(base_name(name)): TaskRef(state, name)
        for state in TaskState
        for name in folders.names(state)
    }


def finished_ids(run: RunPaths) -> set[str]:
    """The ids of the tasks that ended (done, failed, skipped or cancelled)."""
    folders = QueueFolders(run)
    return {task_id_of(name) for state in TaskState.terminal() for name in folders.names(state)}


@dataclass(frozen=True)
class Attempt:
    """The last attempt of an ended task that was not interrupted (a supervisor stopped or
    crashing): what a client judges the task by. Fields are None when it never started.

    Every field of its record (``core/models/attempt.py``) reads through by name as well
    (``last.energy_j``, ``last.tokens_in``): None when it never started."""

    state: TaskState
    n: int = 0
    log: Path | None = None
    metrics: Mapping[str, Any] = field(default_factory=dict)
    gpus: tuple[Any, ...] = ()
    slot: Any = None
    started: Any = None
    ended: Any = None
    duration: Any = None
    returncode: Any = None
    oom: bool = False
    kind: str | None = None  # how it ended: exit, signal, timeout, not-found, ...
    reason: str | None = None
    host: str | None = None  # the machine it ran on (as slot ids spell it)
    accelerator: str | None = None  # its GPUs' model ("NVIDIA H100 80GB HBM3", "sim")
    record: AttemptRecord | None = None  # the whole record (None: it never started)

    def __getattr__(self, name: str) -> Any:
        """A field of the record not spelled above (None when there is no record)."""
        if name not in _RECORD_FIELDS:
            raise AttributeError(name)
        record = self.__dict__.get("record")
        return None if record is None else getattr(record, name)


def last_attempt(run: RunPaths, ref: TaskRef) -> Attempt | None:
    """The attempt an ended task is judged by; None while the task has not ended."""
    if not ref.state.is_terminal():
        return None
    desc = DirQueue(run).read_desc(ref.state, ref.name)
    last = desc.last_counted if desc is not None else None
    if last is None:
        return Attempt(state=ref.state)
    return Attempt(
        state=ref.state,
        n=last.n,
        log=run.attempt_log(task_id_of(base_name(ref.name)), last.n) if last.n else None,
        metrics=last.metrics or {},
        gpus=tuple(last.gpus or ()),
        slot=last.slot,
        started=last.started,
        ended=last.ended,
        duration=last.duration,
        returncode=last.returncode,
        oom=bool(last.oom),
        kind=last.kind,
        reason=last.reason,
        host=last.host,
        accelerator=last.accelerator,
        record=last,
    )


_RECORD_FIELDS = frozenset(AttemptRecord.__dataclass_fields__) - {"extra"}


def read_journal(path: Path) -> Iterator[Mapping[str, object]]:
    """Every complete event line of a journal in the run's format (``events.jsonl``, or a
    client's own journal written the same way), in order; a torn last line is left out. Each
    is an event of any kind, a client's own among them: ``core.events.decode`` types one."""
    return read_events(path)


def has_pending(run: RunPaths) -> bool:
    """Whether any task is queued and not yet claimed."""
    return bool(QueueFolders(run).names(TaskState.PENDING))


# -- serving -----------------------------------------------------------------------------------
def serve(run: RunPaths, *, stream: TextIO | None) -> RunReport:
    """Supervise an existing run on its own GPUs until every queued task has ended (or the run
    lingers idle as its settings say): recovers a crashed supervisor's leftovers first, never
    retries what failed, writes no report.html (the client writes its own)."""
    _, info = open_record(run.root)
    return supervise(
        run,
        prepare(info=info),
        mode="resume",
        output=Output(stream=stream, report=False),
        retry_failed=False,
    )


# -- helper processes (a client's own daemons and tools; not tasks of a run) -------------------
def processes_with_env(name: str, value: str, *, argv_has: str | None = None) -> list[int]:
    """Pids of the processes (but this one) whose environment has ``name=value`` and, when
    given, whose argv holds ``argv_has``."""
    return host_processes.with_env(name, value, argv_has=argv_has)


def stop_processes(pids: Iterable[int], grace: float) -> int:
    """SIGTERM each process (its own warm stop), then after ``grace`` kill the trees of those
    still alive. Returns how many were asked to stop."""
    return host_processes.stop(pids, grace)


def kill_tree(pids: Iterable[int], grace: float) -> int:
    """SIGTERM ``pids`` and their descendants, SIGKILL what is left after ``grace``."""
    return host_processes.kill_tree(pids, grace)
