"""What a run's agents spent (issue 34): tokens and cost per task, per slot and in total.

Every attempt counts (retries, failed and interrupted ones: each was paid for). An attempt
whose cost is unknown (its model has no price) adds its tokens and is counted as unknown, so a
total is never shown smaller than it is without saying so; ``usd_per_done_task`` is the whole
run's known cost over its tasks that ended done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from gpuswarm.core.models import AttemptRecord, Descriptor
from gpuswarm.core.runview import RunView
from gpuswarm.store.spent import journal_spend


class TotalsJson(TypedDict):
    attempts: int
    tokens_in: int
    tokens_cached: int
    tokens_out: int
    cost_usd: float
    cost_unknown_attempts: int


class RunCost(TotalsJson):
    """summary.json's ``cost``."""

    tasks: int
    done_tasks: int
    usd_per_done_task: float | None
    complete: bool  # False: the known part only
    per_slot: dict[str, TotalsJson]
    per_model: dict[str, TotalsJson]
    problems: list[str]


class SpendCells(TypedDict):
    """A task's results.tsv cells (``USAGE_COLUMNS``)."""

    tokens_in: int
    tokens_cached: int
    tokens_out: int
    cost_usd: float | str  # "unknown" when some attempt's is
    model: str


@dataclass
class Totals:
    """Sums over attempts: tokens, the known cost and how many attempts' cost is unknown."""

    attempts: int = 0  # attempts with a usage record
    tokens_in: int = 0
    tokens_cached: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    unknown: int = 0  # attempts with tokens but no cost (no price for their model)
    problems: list[str] = field(default_factory=list)

    def add(self, record: Any) -> None:
        """Add an attempt record's fields (any object with the five attribute names)."""
        tin = getattr(record, "tokens_in", None)
        cost = getattr(record, "cost_usd", None)
        problem = getattr(record, "usage_problem", None)
        if tin is None and cost is None and problem is None:
            return
        self.attempts += 1
        self.tokens_in += tin or 0
        self.tokens_cached += getattr(record, "tokens_cached", None) or 0
        self.tokens_out += getattr(record, "tokens_out", None) or 0
        if cost is None:
            self.unknown += 1
        else:
            self.cost_usd += cost
        if problem is not None and len(self.problems) < 20:
            self.problems.append(problem)

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def as_json(self) -> TotalsJson:
        return {
            "attempts": self.attempts,
            "tokens_in": self.tokens_in,
            "tokens_cached": self.tokens_cached,
            "tokens_out": self.tokens_out,
            "cost_usd": round(self.cost_usd, 6),
            "cost_unknown_attempts": self.unknown,
        }


USAGE_COLUMNS = ("tokens_in", "tokens_cached", "tokens_out", "cost_usd", "model")
UNKNOWN = "unknown"
MAX_PROBLEMS = 20


@dataclass(slots=True)
class TaskSpend:
    """One task's attempts summed, and per slot."""

    total: Totals = field(default_factory=Totals)
    slots: dict[str, Totals] = field(default_factory=dict)
    model: str | None = None

    def cells(self) -> SpendCells:
        """Its results.tsv cells: a cost of ``unknown`` when some attempt's is."""
        t = self.total
        cost: float | str = UNKNOWN if t.unknown else round(t.cost_usd, 6)
        return {
            "tokens_in": t.tokens_in,
            "tokens_cached": t.tokens_cached,
            "tokens_out": t.tokens_out,
            "cost_usd": cost,
            "model": self.model or "",
        }


def has_usage(a: AttemptRecord) -> bool:
    return a.tokens_in is not None or a.cost_usd is not None or a.usage_problem is not None


def task_spend(desc: Descriptor) -> TaskSpend | None:
    """The spend of a task's attempts; None when no attempt reported usage (no agent)."""
    spend: TaskSpend | None = None
    for a in desc.attempts:
        if not has_usage(a):
            continue
        if spend is None:
            spend = TaskSpend()
        spend.total.add(a)
        spend.slots.setdefault(a.slot or "?", Totals()).add(a)
        spend.model = a.model or spend.model
    return spend


@dataclass
class RunSpend:
    """The run's spend, folded task by task."""

    total: Totals = field(default_factory=Totals)
    slots: dict[str, Totals] = field(default_factory=dict)
    models: dict[str, Totals] = field(default_factory=dict)
    tasks: int = 0  # tasks with usage
    done: int = 0  # of the run's tasks, done

    def add(self, spend: TaskSpend | None, *, done: bool) -> None:
        self.done += 1 if done else 0
        if spend is None:
            return
        self.tasks += 1
        _merge(self.total, spend.total)
        for slot, t in spend.slots.items():
            _merge(self.slots.setdefault(slot, Totals()), t)
        _merge(self.models.setdefault(spend.model or "?", Totals()), spend.total)

    def as_json(self) -> RunCost | None:
        """summary.json's ``cost`` (None: no task reported usage)."""
        if not self.tasks:
            return None
        per_done = round(self.total.cost_usd / self.done, 6) if self.done else None
        return {
            **self.total.as_json(),
            "tasks": self.tasks,
            "done_tasks": self.done,
            "usd_per_done_task": per_done,
            "complete": self.total.unknown == 0,  # False: the known part only
            "per_slot": {s: t.as_json() for s, t in sorted(self.slots.items())},
            "per_model": {m: t.as_json() for m, t in sorted(self.models.items())},
            "problems": self.total.problems[:MAX_PROBLEMS],
        }


def _merge(into: Totals, t: Totals) -> None:
    into.attempts += t.attempts
    into.tokens_in += t.tokens_in
    into.tokens_cached += t.tokens_cached
    into.tokens_out += t.tokens_out
    into.cost_usd += t.cost_usd
    into.unknown += t.unknown
    room = MAX_PROBLEMS - len(into.problems)
    if room > 0:
        into.problems += t.problems[:room]


def money(value: float | None, unknown: int = 0) -> str:
    """``$1.23`` (``$0.0042`` below a cent), ``unknown``, or ``$1.23 + unknown``."""
    if value is None:
        return UNKNOWN
    text = f"${value:.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"
    if unknown:
        return f"{text} + {UNKNOWN}" if value else UNKNOWN
    return text


def tokens_text(n: int) -> str:
    """``950``, ``12.3k``, ``4.5M``."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1e6:.1f}M"


def seed_view(view: RunView, events: Path, upto: int) -> None:
    """A view made from the folders gets what the journal's first ``upto`` bytes say the
    attempts spent (its new lines then add theirs)."""
    spent = journal_spend(events, 0, upto)
    if spent is not None:
        with view.lock:
            view.spent_tokens += int(spent["tokens"])
            view.spent_usd += float(spent["cost_usd"])
            view.spent_unknown += int(spent["cost_unknown_attempts"])


def spend_line(cost: dict[str, Any]) -> str:
    """``spent $0.90 (4.7k tokens, 3 attempts; $0.45 per done task)`` for status and the end."""
    tokens = cost.get("tokens")
    if tokens is None:
        tokens = int(cost.get("tokens_in") or 0) + int(cost.get("tokens_out") or 0)
    unknown = int(cost.get("cost_unknown_attempts") or 0)
    text = f"spent {money(float(cost.get('cost_usd') or 0.0), unknown)}"
    text += f" ({tokens_text(int(tokens))} tokens, {cost.get('attempts', 0)} attempts"
    if unknown:
        text += f", {unknown} of unknown cost"
    per = cost.get("usd_per_done_task")
    if per is not None:
        text += f"; {money(float(per))} per done task"
    return text + ")"
