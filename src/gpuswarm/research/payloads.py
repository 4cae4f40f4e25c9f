"""What the research commands return (their ``--json``, and what ``views.py`` prints): one
``TypedDict`` per command's payload, built by session / readouts / configure / loop and read
by the views by key. A leaf: it imports only the journal's entry types."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from typing_extensions import NotRequired

from gpuswarm.research.entries import DiffStat, VariantMeta


class VariantView(TypedDict):
    """``Variant.view()``: a variant as the research commands show it."""

    id: str
    kind: str
    commit: str
    parent: str
    description: str
    round: int
    status: str
    metric: float | None
    memory_gb: float | None
    gpu: str | None
    seconds: float | None
    reason: str | None
    log: str | None
    log_path: str | None


class RunningVariant(TypedDict):
    """``executor.running``: where a variant's task runs, since when, its log."""

    slot: str
    since: float
    log: Path | None


class InFlightView(VariantView):
    slot: str | None
    elapsed: float | None


class FilesCase(TypedDict):
    """``variants.files_case``: whether the user's editable files follow BASE, said plainly."""

    follows: bool
    case: str  # following | behind | edited | other-branch
    message: str


class NoiseView(TypedDict):
    """One entry of ``rules.noise_view``: a noise estimate, per platform (paired: of BASE's
    successive control periods, ``periods`` of them)."""

    sigma: float
    periods: NotRequired[int]
    runs: int
    groups: int
    platform: str
    paired: bool


class DriftView(TypedDict):
    """``controls.Drift.view()``: how far BASE's control runs moved."""

    commit: str
    platform: str
    change: float
    seconds: float
    periods: int
    noise: float | None
    moving: bool


class FiguresView(TypedDict):
    """``figures.Figures.view()``: the counts every view prints alike."""

    baseline: float | None
    best: float | None
    experiments: int
    kept: int
    crashed: int
    rebased: int
    modes: str
    pruned: int
    gpu_saved_s: float


class EnergyFigures(TypedDict):
    energy_j: float | None
    energy_measured: int
    energy_per_kept_j: float | None


class Headline(TypedDict):
    """What wait, status, log and loop start with: BASE, the best, the mode, the files."""

    tag: str
    branch: str
    base: str
    best: float | None
    metric: str
    goal: str
    mode: str
    modes: str
    round: int
    files: FilesCase


class NoiseFigures(TypedDict):
    """The noise line's inputs (``views.noise_line``)."""

    noise: list[NoiseView]
    policy: str


class BestRecorded(TypedDict):
    id: str
    metric: float
    status: str
    commit: str


class LastRow(TypedDict):
    """A recent results.tsv row as ``research status`` shows it."""

    id: str
    commit: str
    metric: float | None
    memory_gb: float
    status: str
    description: str


class PlatformView(TypedDict):
    platform: str
    best: float | None
    baseline: float | None
    runs: int
    moves_base: bool


class Files(TypedDict):
    results: str
    ledger: str


class WaitView(Headline):
    finished: list[VariantView]
    waiting: list[str]
    timed_out: bool


class StatusView(Headline, FiguresView, NoiseFigures, Files):
    best_recorded: BestRecorded | None
    in_flight: list[InFlightView]
    undecided: list[VariantView]
    last: list[LastRow]
    runner: bool
    timeout: float
    drift: list[DriftView]
    platforms: list[PlatformView]


class LoopView(StatusView):
    made: int
    plot: str
    report: str
    stopped: bool
    left_running: list[str]
    exhausted: str | None


class Spent(TypedDict):
    """``proposercost.spent``: what the proposer agent spent on a variant (None: unknown)."""

    proposer_tokens: int | None
    proposer_usd: float | None


class LoggedVariant(VariantView, Spent):
    """A variant as ``research log`` shows it: every field the ledger has."""

    source: str
    origin: str | None
    meta: VariantMeta
    host: str | None
    accelerator: str | None
    started: float | None
    ended: float | None
    exit: int | None
    summary: dict[str, float]
    diff: DiffStat | None
    tail: str
    energy_j: float | None
    decision: LoggedDecision | None


class LoggedDecision(TypedDict):
    status: str | None
    reason: str | None
    row: list[str] | None
    ts: float | None


class LogView(Headline, EnergyFigures):
    variants: list[LoggedVariant]
    total: int
    left_out: int


class Replay(TypedDict, total=False):
    """``replay.replay_decisions``: what other settings would have decided."""

    policy: dict[str, object]
    # per variant: id, kind, description, metric, platform, recorded / replayed (status) and
    # their reasons (None where there is none)
    variants: list[dict[str, Any]]
    kept: list[str]
    would_keep: list[str]
    best: float | None
    noise: list[NoiseView]
    pruned: dict[str, dict[str, Any]]  # issue 38: prune_replay.py's, per variant
    pruning: dict[str, Any]  # issue 38: prune_replay.summary's
    tag: str
    spec: str


class Queued(TypedDict):
    """``research baseline``: the runs queued."""

    queued: list[VariantView]
    base: str


class Tried(TypedDict):
    """``research try``: the variant queued."""

    id: str
    commit: str
    parent: str
    round: int
    baseline_queued: list[str]
    diff: DiffStat
    rerun: NotRequired[str]  # issue 38: `try --rerun ID`, the variant run again


class Decided(TypedDict, total=False):
    """``research keep`` / ``discard``: the decision and where BASE is."""

    id: str
    status: str
    base: str
    files: FilesCase


class Restored(TypedDict):
    base: str
    files: list[str]


class Made(Files):
    """``research init``: the experiment made."""

    tag: str
    branch: str
    base: str
    dir: str


class Configured(TypedDict):
    """``research config``: what changed (``[old, new]``) and every setting now."""

    changed: dict[str, list[object]]
    settings: dict[str, object]
    file: str


class Knob(TypedDict):
    """A numeric setting of BASE's files (``research mutate --list``)."""

    name: str
    value: str
    file: str
    line: int
    knob: bool
    tries: list[str]
    why: str | None


class Knobs(TypedDict):
    base: str
    settings: list[Knob]
