"""What the research commands return (their ``--json``, and what ``views.py`` prints): one
``TypedDict`` per command's payload, built by session / readouts / configure / loop and read
by the views by key. A leaf: it imports only the journal's entry types."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

from typing_extensions import NotRequired, Required

from gpuswarm.research.entries import DiffStat, PruneVerdict, VariantMeta


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


class ReplayedVerdict(PruneVerdict):
    """Issue 38: a run the replayed pruning rule stops (``prune_replay.py``): the verdict,
    the GPU seconds it saves and the metric it loses."""

    saved_s: float
    metric: float | None


class RecordedPrune(PruneVerdict, total=False):
    """Issue 38: a run the loop stopped for real: its ``pruned`` line (with its ``ts``, ``ev``
    and ``id``), the seconds it saved (its metric was never measured)."""

    saved_s: Required[float]
    metric: Required[None]
    recorded: Required[bool]


ReplayedPrune = ReplayedVerdict | RecordedPrune


class PruningReplay(TypedDict):
    """Issue 38: ``prune_replay.summary``: which runs the rule stops, the GPU time saved."""

    curves: int  # runs with a recorded curve: none, and the replay can stop nothing
    rule: str
    grace: float
    k: float
    would_prune: list[str]
    runs: dict[str, ReplayedPrune]
    gpu_saved_s: float
    best: float | None
    best_unpruned: float | None
    best_changed: bool


class ReplayedVariant(TypedDict):
    """One variant of a replay: what was recorded and what the replayed policy decides (None
    where there is no status or reason)."""

    id: str
    kind: str
    description: str
    metric: float | None
    platform: str
    recorded: str | None
    recorded_reason: str | None
    replayed: str | None
    replayed_reason: str | None


class Replay(TypedDict, total=False):
    """``replay.replay_decisions``: what other settings would have decided."""

    policy: dict[str, object]
    variants: list[ReplayedVariant]
    kept: list[str]
    would_keep: list[str]
    best: float | None
    noise: list[NoiseView]
    pruned: dict[str, ReplayedPrune]  # issue 38: prune_replay.py's, per variant
    pruning: PruningReplay  # issue 38
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
