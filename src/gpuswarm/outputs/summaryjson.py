"""summary.json, typed (issue 32, step 6): what ``outputs/aggregate.py`` ``summarize`` writes
(the supervisor adds its keys: quarantined, stopped, ..., ``state``). Built as a literal in its
keys' order; readers of a file on disk parse it as JSON (older files lack newer keys)."""

from __future__ import annotations

from typing import TypedDict

from typing_extensions import NotRequired

from gpuswarm.outputs.energy import EnergyStats
from gpuswarm.outputs.gpumem import GpuMemoryStats
from gpuswarm.outputs.passk import RepeatsJson
from gpuswarm.outputs.slurmview import JobRecord
from gpuswarm.outputs.spend import RunCost
from gpuswarm.outputs.taskrow import ApartJson, FailureJson
from gpuswarm.store.quarantines import Quarantined


class Best(TypedDict):
    task: str
    value: float
    by: str  # lowest or highest


class FieldStats(TypedDict, total=False):
    """summary.json's ``fields[key]``: of a number (``kind: number``), a boolean (``bool``)
    or a field that repeats the task's inputs (``input``)."""

    kind: str
    n: int
    mean: float
    median: float
    p90: float
    min: float
    max: float
    min_task: str
    max_task: str
    best: Best
    values: list[str]  # an input's distinct values (50 at most)
    true: int
    of_done: int
    of_total: int
    rate_done: float | None
    rate_total: float | None


class SummaryJson(TypedDict):
    """What ``summarize`` makes of a run's rows."""

    run: str  # run.json's run_dir
    name: str
    written: str
    total: int
    complete: bool  # every task ended done, skipped or cancelled
    counts: dict[str, int]
    busy_seconds: float
    not_done: int  # the true count ("failures" lists the first 200)
    failure_reasons: list[tuple[str, int]]
    wall_seconds: float | None
    failures: list[FailureJson]
    skipped: list[ApartJson]
    cancelled: list[ApartJson]
    fields: dict[str, FieldStats]
    gpu_memory: GpuMemoryStats
    energy: EnergyStats
    cost: NotRequired[RunCost]  # issue 34: when some task reported usage
    repeats: NotRequired[RepeatsJson]  # issue 34: when some task is repeated
    state: NotRequired[str]  # how the run ended (``end_state``), set when it is written


class _AfterAllRan(TypedDict):
    command: str
    log: str  # the file of its output, in the run folder


class AfterAllJson(_AfterAllRan, total=False):
    """summary.json's ``after_all``: the post-processing step's outcome (the shape of
    ``supervise/after_all.py``'s ``AfterAllRecord``; outputs never import supervise)."""

    ok: bool
    exit: int | None
    seconds: float
    reason: str | None  # stopped, its wait failed, or why it failed


class SessionEnd(TypedDict, total=False):
    """What a session's supervisor (or Slurm's login-node driver) adds to summary.json: how it
    ended, over what ``summarize`` makes of the rows."""

    quarantined: list[Quarantined]
    stopped: bool
    stopped_by: str  # the backend's reason, the halt rule's, the budget's, a signal's
    requeued: int  # running tasks a stop put back
    slurm_jobs: list[JobRecord]  # issue 36: a login-node run's worker jobs
    after_all: AfterAllJson  # once every task ended: the post-processing step's outcome


class RunSummary(SummaryJson, SessionEnd):
    """summary.json as a session writes it: the rows' aggregate and how the session ended."""
