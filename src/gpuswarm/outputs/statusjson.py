"""The JSON of ``gpuswarm status`` and ``gpuswarm ls`` (``--json``: the same objects the
terminal prints), typed (issue 32, step 6). Each is built as a literal in its keys' order."""

from __future__ import annotations

from typing import Any, TypedDict

from gpuswarm.outputs.slurmview import SlurmView
from gpuswarm.store.quarantines import Quarantined


class QuarantineFile(TypedDict, total=False):
    """A live run's quarantine file (``store/quarantines.py``): the slot, its supervisor, since
    when, and the breaker's reason, GPUs and next probe."""

    slot: str
    owner: str
    since: float  # epoch seconds
    reason: str
    gpus: list[int]
    probe_at: float  # epoch seconds of its next probe


class LiftedQuarantine(QuarantineFile, total=False):
    """A quarantine ``gpuswarm unquarantine`` lifted: its file, by name."""

    file: str


class RunningLine(TypedDict):
    task: str
    name: str
    owner: str | None
    host: str | None
    slot: str | None  # unique in the run
    attempt: int
    elapsed: float
    timeout: float | None
    log: str | None  # None while a retry waits out its backoff
    retry_at: float | None


class FailureLine(TypedDict):
    task: str
    name: str
    attempts: int  # as results.tsv counts them
    interrupted: int  # attempts a stop handed back (numbered, not counted)
    reason: str
    log: str | None
    log_tail: str


class Eta(TypedDict):
    mean_seconds: float | None
    eta_seconds: float | None


class GpuHeld(TypedDict):
    gpu: int
    reason: str


class GpuWait(TypedDict):
    task: str
    reason: str


class PausedJson(TypedDict):
    run: bool
    slots: list[str]


class StatusShown(TypedDict):
    """What ``status`` shows of a run (redacted as a whole)."""

    name: str
    created: Any  # run.json's, as it is there
    live: bool
    state: str
    hint: str
    gpus: Any  # run.json's
    counts: dict[str, int]
    total: int
    running: list[RunningLine]
    failures: list[FailureLine]
    eta: Eta | None
    corrupt: list[str]
    quarantined: list[QuarantineFile | Quarantined]  # a live run's files, else summary.json's
    gpus_held: list[GpuHeld]
    waiting_for_gpu: list[GpuWait]
    paused: PausedJson
    slurm: SlurmView | None  # issue 36: worker jobs, the allocation (None without Slurm)
    cost: Any  # store/spent.py's journal_spend, None without agents


class StatusJson(StatusShown):
    """``gpuswarm status --json``: the run folder, then what it shows."""

    run: str


class RunLine(TypedDict):
    """A run's line of ``gpuswarm ls``."""

    run: str
    name: str
    live: bool
    state: str
    counts: dict[str, int]
    total: int
