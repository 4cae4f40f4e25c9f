"""report.html's cost section (issue 34): what the agents' attempts spent, in total, per slot,
per model and per task, and USD per task that ended done."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuswarm.core.words import counted
from gpuswarm.outputs.html import esc, html_table
from gpuswarm.outputs.rowtypes import Row
from gpuswarm.outputs.spend import UNKNOWN, money, tokens_text

MAX_TASK_ROWS = 500  # the most expensive first; every task is in results.tsv


def _counted(cost: Mapping[str, Any], key: str, word: str) -> str:
    """``1 task``, ``2 tasks``; the value as it is when it is no count."""
    n = cost.get(key)
    return counted(n, word) if isinstance(n, int) else f"{n} {word}s"


def _cost(t: Mapping[str, Any]) -> str:
    return money(float(t.get("cost_usd") or 0.0), int(t.get("cost_unknown_attempts") or 0))


def _totals_row(name: str, t: Mapping[str, Any]) -> dict[str, object]:
    return {
        "name": name,
        "attempts": t.get("attempts", 0),
        "tokens_in": t.get("tokens_in", 0),
        "tokens_cached": t.get("tokens_cached", 0),
        "tokens_out": t.get("tokens_out", 0),
        "cost": _cost(t),
    }


_TOTAL_COLUMNS = {
    "attempts": "attempts",
    "tokens_in": "tokens in",
    "tokens_cached": "of them cached",
    "tokens_out": "tokens out",
    "cost": "cost",
}


def cost_section(summary: Mapping[str, Any], rows: Sequence[Row]) -> str:
    """Empty when no task reported usage (a run without agents)."""
    cost = summary.get("cost")
    if not isinstance(cost, Mapping):
        return ""
    unknown = int(cost.get("cost_unknown_attempts") or 0)
    per = cost.get("usd_per_done_task")
    tokens = int(cost.get("tokens_in") or 0) + int(cost.get("tokens_out") or 0)
    out = [
        "<h2>What the run cost</h2>",
        f"<p><b>{esc(_cost(cost))}</b> for {esc(_counted(cost, 'attempts', 'agent attempt'))}"
        f" of {esc(_counted(cost, 'tasks', 'task'))}: {esc(tokens_text(tokens))} tokens "
        f"({esc(cost.get('tokens_in'))} in, {esc(cost.get('tokens_cached'))} of them cached, "
        f"{esc(cost.get('tokens_out'))} out). <b>USD per successful task: "
        f"{esc(money(float(per), unknown) if per is not None else 'none done')}</b> "
        f"({esc(cost.get('done_tasks'))} done; every attempt counts, retries and failures "
        "too).</p>",
    ]
    if unknown:
        out.append(
            f"<p class=note>{counted(unknown, 'attempt')} "
            f"{'has an unknown cost (its' if unknown == 1 else 'have an unknown cost (their'} "
            "tokens are counted): "
            "the amounts are what is known; price their model under <code>pricing:</code> in "
            "the config.</p>"
        )
    for problem in cost.get("problems") or []:
        out.append(f"<p class=note>{esc(problem)}</p>")
    slots = cost.get("per_slot") or {}
    out.append("<h3>Per slot</h3>")
    out.append(
        html_table(
            {"name": "slot", **_TOTAL_COLUMNS}, [_totals_row(s, t) for s, t in slots.items()]
        )
    )
    models = cost.get("per_model") or {}
    out.append("<h3>Per model</h3>")
    out.append(
        html_table(
            {"name": "model", **_TOTAL_COLUMNS}, [_totals_row(m, t) for m, t in models.items()]
        )
    )
    out.append(_per_task(rows))
    return "\n".join(out) + "\n"


def _per_task(rows: Sequence[Row]) -> str:
    spent = [r for r in rows if r.spend is not None]

    def key(r: Row) -> float:
        assert r.spend is not None
        return r.spend.total.cost_usd + (1e9 if r.spend.total.unknown else 0.0)

    spent.sort(key=key, reverse=True)
    table = []
    for r in spent[:MAX_TASK_ROWS]:
        assert r.spend is not None
        t = r.spend.total
        cost = money(t.cost_usd, t.unknown) if t.attempts else UNKNOWN
        table.append(
            {
                "task": r.values.get("task"),
                "state": r.values.get("state"),
                "attempts": t.attempts,
                "tokens_in": t.tokens_in,
                "tokens_cached": t.tokens_cached,
                "tokens_out": t.tokens_out,
                "cost": cost,
                "model": r.spend.model or "",
            }
        )
    note = (
        f"<p class=note>the {MAX_TASK_ROWS} most expensive of {len(spent)} tasks</p>\n"
        if len(spent) > MAX_TASK_ROWS
        else ""
    )
    columns = {"task": "task", "state": "state", **_TOTAL_COLUMNS, "model": "model"}
    return "<h3>Per task</h3>\n" + note + html_table(columns, table)
