"""What the views make of the agents' spend (issue 34): the reducer's totals from the journal's
finished lines, the live table's line, status's journal fold, per-task and per-slot sums with
unknown costs, pass@k and confidence intervals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpuswarm.core.models import AttemptRecord, Descriptor
from gpuswarm.core.runview import RunView
from gpuswarm.outputs.costreport import cost_section
from gpuswarm.outputs.passk import mean_ci, pass_at_k
from gpuswarm.outputs.spend import RunSpend, money, task_spend, tokens_text
from gpuswarm.store.spent import journal_spend
from gpuswarm.ui.table import live_spend

FINISHED = {"ev": "finished", "task": "t", "slot": "s0", "state": "done"}


def test_the_reducer_folds_spend_and_unknown_costs() -> None:
    view = RunView({"pending": 0, "running": 2, "done": 0, "failed": 0})
    view.apply({**FINISHED, "tokens": 1500, "cost_usd": 0.25})
    view.apply({**FINISHED, "tokens": 500, "cost_usd": None, "cost_unknown": True})
    view.apply({**FINISHED, "tokens": "many"})  # mistyped: the line is skipped, never a crash
    assert (view.spent_tokens, view.spent_usd, view.spent_unknown) == (2000, 0.25, 1)
    view.started = 0.0
    line = live_spend(view, 1800.0)  # half an hour
    assert line == "spent $0.25 + unknown  2.0k tokens  $0.50/h  (1 of unknown cost)"
    assert live_spend(RunView({}), 10.0) == ""  # no agent: no line


def test_status_folds_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "events.jsonl"
    lines = [
        json.dumps({**FINISHED, "tokens": 100, "cost_usd": 0.1}),
        json.dumps({"ev": "started", "task": "t", "slot": "s0", "attempt": 1}),
        json.dumps({**FINISHED, "tokens": 50, "cost_unknown": True}),
        '{"ev": "finished", "tokens": 7, "cost_usd": 0.0',  # a torn last line: not counted
    ]
    journal.write_text("\n".join(lines))
    got = journal_spend(journal, done=2)
    assert got == {"attempts": 2, "tokens": 150, "cost_usd": 0.1, "cost_unknown_attempts": 1,
                   "usd_per_done_task": 0.05}  # fmt: skip
    assert journal_spend(tmp_path / "none.jsonl", done=0) is None
    link = tmp_path / "link.jsonl"
    link.symlink_to(journal)
    assert journal_spend(link, done=0) is None  # never through a link


def _attempt(n: int, slot: str, cost: float | None) -> dict[str, object]:
    rec = AttemptRecord(n=n, slot=slot, tokens_in=1000, tokens_cached=100, tokens_out=10,
                        cost_usd=cost, model="m",
                        usage_problem=None if cost is not None else "cost unknown")  # fmt: skip
    return rec.to_json()


def test_every_attempt_counts_per_task_and_slot() -> None:
    desc = Descriptor({"id": "t", "task": {"usage": {}}, "attempts": [
        _attempt(1, "a", 0.5), _attempt(2, "b", None), _attempt(3, "b", 0.25)]})  # fmt: skip
    spend = task_spend(desc)
    assert spend is not None
    assert spend.cells() == {"tokens_in": 3000, "tokens_cached": 300, "tokens_out": 30,
                             "cost_usd": "unknown", "model": "m"}  # fmt: skip
    assert spend.slots["b"].cost_usd == 0.25 and spend.slots["b"].unknown == 1
    run = RunSpend()
    run.add(spend, done=True)
    run.add(None, done=True)  # a task without an agent: counted done, no spend
    out = run.as_json()
    assert out is not None
    assert out["cost_usd"] == 0.75 and out["cost_unknown_attempts"] == 1 and not out["complete"]
    assert out["usd_per_done_task"] == 0.375 and out["per_slot"]["a"]["cost_usd"] == 0.5
    assert RunSpend().as_json() is None


def test_money_and_tokens_text() -> None:
    assert money(1.234) == "$1.23" and money(0.0042) == "$0.0042" and money(0.0) == "$0.00"
    assert money(None) == "unknown" and money(0.0, 2) == "unknown"
    assert tokens_text(999) == "999" and tokens_text(12_345) == "12.3k"
    assert tokens_text(4_500_000) == "4.5M"


def test_pass_at_k_and_confidence_intervals() -> None:
    assert pass_at_k(4, 2, 1) == 0.5 and pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - math.comb(7, 5) / math.comb(10, 5))
    one = mean_ci([3.0])
    assert one == {"n": 1, "mean": 3.0, "ci95": None}
    two = mean_ci([1.0, 3.0])  # t(0.975, 1) = 12.706, s = sqrt(2)
    half = 12.706 * math.sqrt(2) / math.sqrt(2)
    assert two["ci95"] == pytest.approx([2.0 - half, 2.0 + half])
    many = mean_ci([float(x) for x in range(40)])  # above 30 repeats: the normal 1.96
    assert many["ci95"] is not None and many["mean"] is not None
    assert many["ci95"][1] - many["mean"] == pytest.approx(1.96 * many["sd"] / math.sqrt(40))


def test_the_cost_section_counts_its_words() -> None:
    """Issue 33's plurals in report.html's cost section: one attempt of one task, one attempt
    of unknown cost (``1 attempts have`` was the page's)."""
    cost = {"attempts": 1, "tasks": 1, "cost_usd": 0.0, "cost_unknown_attempts": 1}
    one = cost_section({"cost": {**cost, "tokens_in": 5, "tokens_out": 5}}, [])
    assert "for 1 agent attempt of 1 task:" in one, one
    assert "1 attempt has an unknown cost (its tokens are counted)" in one, one
    two = {**cost, "attempts": 2, "tasks": 2, "cost_unknown_attempts": 2}
    text = cost_section({"cost": two}, [])
    assert "for 2 agent attempts of 2 tasks:" in text and "2 attempts have an unknown" in text
