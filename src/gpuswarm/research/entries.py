"""The typed lines of an experiment's journal (``ledger.jsonl``): one ``TypedDict`` per event
kind, :func:`parse` (a line's JSON object -> its typed entry, a bad line named by file and
line) and :func:`to_json` (an entry -> its line, byte for byte what the journal has always
held). ``journal.py`` appends and replays them; every reader goes through these types.

Every key but the few a kind cannot do without is optional: lines older versions wrote lack
the keys added since (``gpu_models``, ``meta``, ``energy_j``, ``curve``, ...) and read the same.
A results.tsv row (a ``decided`` line's ``row``) is read by column through :class:`ResultRow`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypedDict, cast

from typing_extensions import Required

from gpuswarm.core.errors import ResearchError
from gpuswarm.core.records import parse_event


class DiffStat(TypedDict):
    """``gitops.diff_stat``: what a variant changed on its parent."""

    files: int
    insertions: int
    deletions: int


class BaseMetric(TypedDict):
    """A keep's ``base_metric``: BASE's metric once ``commit`` is BASE."""

    commit: str
    value: float


class VariantMeta(TypedDict, total=False):
    """A variant's notes: the mutation's digest and changes, the platform a baseline is pinned
    to, a re-run's origin (issue 38), the proposer's spend (issue 34)."""

    digest: str
    changes: list[list[str]]
    platform: str
    rerun: str
    full: bool
    prompt: int  # the agent's prompt file number
    proposer_tokens: int
    proposer_usd: float


class InitEntry(TypedDict, total=False):
    ts: float
    ev: Literal["init"]
    base: Required[str]
    branch: str
    tag: str
    gpu_models: dict[str, int]


class VariantEntry(TypedDict, total=False):
    ts: Required[float]
    ev: Literal["variant"]
    id: Required[str]
    kind: Required[str]  # variant | baseline | combo | confirm | control
    commit: Required[str]
    parent: Required[str]
    description: Required[str]
    round: int
    source: str
    origin: str | None
    meta: VariantMeta


class PruneVerdict(TypedDict, total=False):
    """Issue 38: where and why ``prune.py``'s rule stopped a run (``Verdict.record``)."""

    t: float
    value: float
    ref: float
    noise: float
    budget: float
    rule: str
    k: float
    grace: float


class PrunedEntry(PruneVerdict, total=False):
    """Issue 38: the loop stopped a run early (``prune.py``'s verdict)."""

    ts: float
    ev: Literal["pruned"]
    id: str


class FinishedEntry(TypedDict, total=False):
    """A variant's run ended (``outcome.py``'s fields): ok or why not, the metric, where."""

    ts: float
    ev: Literal["finished"]
    id: str
    ok: bool
    metric: float | None
    memory_gb: float | None
    reason: str | None
    summary: dict[str, float]
    gpu: str
    slot: str | int | None
    host: str
    accelerator: str | None
    started: float | None
    ended: float | None
    seconds: float | None
    exit: int | None
    log: str | None
    log_path: str | None
    tail: str
    energy_j: float | None  # issue 37
    energy_mode: str | None
    curve: list[list[float]]  # issue 38
    diff: DiffStat
    withdrawn: bool
    pruned: PruneVerdict  # the loop's ``pruned`` line, or a replay's verdict
    saved_s: float


class DecidedEntry(TypedDict, total=False):
    ts: float
    ev: Literal["decided"]
    id: str
    status: str  # keep | discard | crash | pruned | withdrawn
    reason: str
    row: list[str] | None  # its results.tsv row (None: withdrawn, measured nothing)
    base_metric: BaseMetric | None


# ``from`` is a keyword: the functional form
BaseEntry = TypedDict(
    "BaseEntry",
    {"ts": float, "ev": Literal["base"], "from": str, "to": Required[str], "id": str},
    total=False,
)


class WorktreeEntry(TypedDict, total=False):
    ts: float
    ev: Literal["worktree"]
    base: Required[str]


class SeenEntry(TypedDict, total=False):
    ts: float
    ev: Literal["seen"]
    ids: Required[list[str]]


class SealedEntry(TypedDict, total=False):
    ts: float
    ev: Literal["sealed"]
    n: Required[int]


class ModeEntry(TypedDict, total=False):
    ts: float
    ev: Literal["mode"]
    mode: Required[str]


class ControlsEntry(TypedDict, total=False):
    ts: float
    ev: Literal["controls"]
    paired: bool
    every: int | None  # a control run every this many results (None: as the loop decides)


class PruningEntry(TypedDict, total=False):
    """Issue 38: a loop turned pruning on (``PruneOptions``' fields)."""

    ts: float
    ev: Literal["pruning"]
    rule: str
    k: float
    grace: float


class ConfigEntry(TypedDict, total=False):
    """``research config``: each changed setting, ``[old, new]``."""

    ts: float
    ev: Literal["config"]
    changes: dict[str, list[object]]


class ProposalUsage(TypedDict, total=False):
    """What one agent run spent, as its CLI reported it (``spend.py``; a key it did not
    report is absent)."""

    tokens_in: int
    tokens_cached: int
    tokens_out: int
    cost_usd: float
    model: str
    usage_problem: str


class ProposalEntry(ProposalUsage, total=False):
    """A proposer agent's proposal made or failed, with what it spent (issue 34)."""

    ts: float
    ev: Literal["proposal"]
    proposer: str
    outcome: str  # made | failed
    reason: str
    prompt: int | None
    description: str


Entry = (
    InitEntry
    | VariantEntry
    | FinishedEntry
    | DecidedEntry
    | BaseEntry
    | WorktreeEntry
    | SeenEntry
    | SealedEntry
    | ModeEntry
    | ControlsEntry
    | PruningEntry
    | PrunedEntry
    | ConfigEntry
    | ProposalEntry
)

# per kind: the keys it cannot do without, and what each must be
_NEEDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "init": {"base": str},
    "variant": {
        "id": str,
        "kind": str,
        "commit": str,
        "parent": str,
        "description": str,
        "ts": (int, float),
    },
    "finished": {"id": str},
    "decided": {"id": str, "status": str},
    "base": {"to": str},
    "worktree": {"base": str},
    "seen": {"ids": list},
    "sealed": {"n": int},
    "mode": {"mode": str},
    "controls": {},
    "pruning": {},
    "pruned": {"id": str},
    "config": {},
    "proposal": {},
}
KINDS = frozenset(_NEEDS)


def parse(raw: dict[str, Any], where: str = "ledger.jsonl") -> Entry | None:
    """A journal line's JSON object as its typed entry; None for a kind this version does not
    know (skipped, as replay always has). A line that lacks a key its kind needs, or holds
    one of the wrong type, is a ResearchError naming ``where`` (``file:line``) and the key."""
    kind = raw.get("ev")
    if not isinstance(kind, str) or kind not in _NEEDS:
        return None
    for key, want in _NEEDS[kind].items():
        if key not in raw:
            raise ResearchError(f"{where}: a {kind!r} line without {key!r}: {_cut(raw)}")
        value = raw[key]
        if not isinstance(value, want) or isinstance(value, bool):
            raise ResearchError(
                f"{where}: a {kind!r} line's {key!r} is {type(value).__name__}, not "
                f"{_names(want)}: {_cut(raw)}"
            )
    return cast(Entry, raw)  # checked above: its kind's keys are there, of their types


def metric_of(fin: FinishedEntry | None) -> float:
    """A finished run's metric, where it must have one (a kept run); TypeError if none."""
    value = None if fin is None else fin.get("metric")
    if value is None:
        raise TypeError("a run without a metric where one was measured")
    return float(value)


def to_json(entry: Entry) -> bytes:
    """The entry's journal line (compact JSON, newline-terminated), as ``append`` writes it."""
    return json.dumps(entry, default=str, separators=(",", ":")).encode() + b"\n"


def read(path: Path) -> Iterator[Entry]:
    """Every entry of a journal, in order: a torn last line and a line that is no JSON event
    are left out (as ``api.read_journal`` does); a bad line of a known kind is an error."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.endswith(b"\n"):
                break  # torn last line
            raw = parse_event(line)
            if raw is None:
                continue
            entry = parse(raw, f"{path}:{n}")
            if entry is not None:
                yield entry


class ResultRow(NamedTuple):
    """A results.tsv row (a ``decided`` line's ``row``), its five columns by name."""

    commit: str
    metric: str  # the metric as the TSV shows it ("0.000000" for a crash)
    memory_gb: str
    status: str
    description: str

    @classmethod
    def of(cls, cells: Sequence[str]) -> ResultRow:
        return cls(*cells[:5])

    @property
    def measured(self) -> bool:
        """Whether the row's metric is a measurement (not a crash's or a pruned run's 0)."""
        return self.status not in ("crash", "pruned")


def _names(want: type | tuple[type, ...]) -> str:
    kinds = want if isinstance(want, tuple) else (want,)
    return " or ".join(k.__name__ for k in kinds)


def _cut(raw: object, limit: int = 160) -> str:
    text = json.dumps(raw, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."
