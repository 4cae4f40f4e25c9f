"""The JSON shapes a run's pages get (issue 32, step 6): the runs page's line of a run, the run
page's live view, its snapshot and updates, and an ended run's view (``finished.final_view``).
Typed so that a field a page reads is declared once; the JSON itself is what it always was
(each built as a literal in the order the pages have always got it)."""

from __future__ import annotations

from typing import Any, NamedTuple, TypedDict

from typing_extensions import NotRequired

from gpuswarm.dashboard.gpustats import GpuSample
from gpuswarm.outputs.groups import GroupProgress
from gpuswarm.outputs.taskrow import FailureJson
from gpuswarm.research.payloads import BestRecorded, FiguresView


class SlotCount(TypedDict):
    attempts: int
    exited: int  # of them, exited 0


class SlotShare(SlotCount):
    """A slot's line of the ended run's page."""

    busy_seconds: float
    busy_share: float
    quarantined: str | None  # its badge (``finished.quarantine_marks``)


class ShownQuarantine(TypedDict):
    slot: str
    gpus: list[int]
    reason: str
    lifted: str | None


class FinalSummary(TypedDict):
    """An ended run's view without its lanes (the run page's ``final``)."""

    window: list[float] | None
    busy_share: float | None
    slots: dict[str, SlotShare]
    failures: list[FailureJson]
    not_done: int | None
    quarantined: list[ShownQuarantine]
    summary: bool


class FinalBar(NamedTuple):
    """An ended run's attempt on its lane: a JSON list ``[start, end, outcome, task, n]``
    (a live run's bars have the same form: ``lanes.Bar.as_json``), read here by name."""

    start: float
    end: float
    outcome: str
    task: str
    attempt: int


class FinalView(FinalSummary):
    """``finished.final_view``: the summary and every lane's bars."""

    lanes: dict[str, list[FinalBar]]


def without_lanes(view: FinalView) -> FinalSummary:
    """The view as the run page's ``final`` carries it (the lanes go apart)."""
    return {
        "window": view["window"],
        "busy_share": view["busy_share"],
        "slots": view["slots"],
        "failures": view["failures"],
        "not_done": view["not_done"],
        "quarantined": view["quarantined"],
        "summary": view["summary"],
    }


class Spent(TypedDict):
    """What the agents of a run spent, as the journal says (issue 34)."""

    cost_usd: float
    tokens: int
    cost_unknown_attempts: int


class RunHeader(TypedDict):
    """A run's line on the runs page."""

    id: str
    kind: str
    title: str
    folder: str
    path: str
    created: Any  # run.json's, as it is there
    state: str
    live: bool
    counts: dict[str, int]
    total: int
    progress: float
    eta: float | None
    note: str
    spent: Spent | None
    experiment: NotRequired[str]  # the listing's (catalog): the experiment it is the core run of


class SlotLine(TypedDict):
    """A slot's line of the run page."""

    label: str
    host: str
    gpus: list[int]
    task: str
    name: str
    attempt: int
    since: float | None
    timeout: float | None
    done: int
    last_line: str
    gpu: list[GpuSample]
    paused: bool
    quarantined: str | None


class RunViewJson(RunHeader):
    """The run page's live part."""

    now: float
    paused: bool
    slots: list[SlotLine]
    failures: list[str]
    slurm: list[str]
    nvml: bool
    groups: dict[str, GroupProgress]
    final: FinalSummary | None


class TaskLine(TypedDict, total=False):
    """A row of the run page's task table (a task that moved on since: id, name, state and
    ``moving`` only)."""

    id: str
    name: str
    state: str
    moving: bool
    priority: int
    attempts: int | float | str
    max_attempts: int
    seconds: int | float | str
    exit: str
    reason: str


class TaskPage(TypedDict):
    """One page of the task table."""

    total: int  # matching rows
    offset: int
    limit: int
    rows: list[TaskLine]
    names_known: bool


class SlotPlace(TypedDict):
    slot: str
    since: float


class InFlightLine(TypedDict):
    """A variant of an experiment not recorded yet, and where it is."""

    id: str
    kind: str
    commit: str
    description: str
    round: int
    status: str  # running | ended | queued
    slot: str | None
    since: float | None
    timeout: float


class VariantDiff(TypedDict):
    """A variant's change against its parent, as the experiment page shows it."""

    id: str
    kind: str
    commit: str
    parent: str
    description: str
    status: str
    metric: Any  # its finished record's, as the journal has it
    reason: str
    diff: str
    seconds: float


class RunningAt(TypedDict):
    slot: str | None
    since: float
    attempt: int


class TaskDetail(TypedDict):
    """The task page's record of a task (everything but the log)."""

    id: str
    name: str
    state: str
    waiting: bool
    retry_at: float | None
    reason: str
    priority: int
    max_attempts: int
    used: int
    timeout: float | None  # seconds, as its spec wrote them
    command: Any  # its argv or shell line, redacted
    command_line: Any
    cwd: str | None
    running: RunningAt | None
    attempts: list[dict[str, object]]  # every field of each record (AttemptRecord.field_values)
    metrics: Any  # the last counted attempt's, as the task reported them
    result: Any  # the task's result file, as it wrote it
    logs: list[int]
    env: list[str]  # names only: values may be secrets


class PageSettings(TypedDict):
    timeout_default: float | None


class RunSnapshot(TypedDict):
    """What a run page gets first (``runhub.RunHub.snapshot``): the view, every lane, the
    recent journal lines for its feed, at journal offset ``pos``."""

    pos: int
    view: RunViewJson
    lanes: dict[str, list[Any]]  # label -> bars as JSON lists (FinalBar's form)
    feed: list[dict[str, object]]  # journal lines, redacted (``runhub.public_event``)
    settings: PageSettings


class RunUpdate(TypedDict):
    """What a run page at an older offset gets (``runhub.RunHub.update``)."""

    pos: int
    events: list[dict[str, object]]  # the journal lines it missed, redacted
    view: RunViewJson
    lanes: dict[str, list[Any]]  # the lanes those lines touched


class ExperimentFacts(FiguresView):
    """What an experiment's line on the runs page and its page's view both say."""

    id: str
    kind: str
    title: str
    path: str
    repo: str
    branch: str
    metric: str
    goal: str
    base: str
    best_recorded: BestRecorded | None
    run: str
    live: bool
    state: str


class ExperimentHeader(ExperimentFacts):
    """An experiment's line on the runs page (``experiments.ExperimentHub.header``)."""

    in_flight: int  # how many variants are not recorded yet


class ResultLine(TypedDict):
    """A results.tsv row as the experiment page shows it."""

    n: int
    id: str
    commit: str
    metric: float | None
    memory_gb: float | None
    status: str
    description: str
    kind: str
    reason: str


class ExperimentView(ExperimentFacts):
    """The experiment page's view: its facts, its results and its variants in flight."""

    rows: list[ResultLine]
    best_steps: list[list[float]]  # [experiment number, BASE's metric] after each keep
    in_flight: list[InFlightLine]


class ExperimentSnapshot(TypedDict):
    """What an experiment page gets (``experiments.ExperimentHub.snapshot``)."""

    pos: int
    view: ExperimentView
