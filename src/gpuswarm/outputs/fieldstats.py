"""summary.json's ``fields``: per result or metric field, pass rates of booleans and the spread
of numbers, with the tasks at their ends.

Rates use honest denominators: a boolean result field is reported over the tasks that finished
(``of_done``) and over every task of the run (``of_total``), so a run where half the tasks crashed
cannot look perfect.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

from gpuswarm.core.models import State
from gpuswarm.outputs.results import APART, natural
from gpuswarm.outputs.rowtypes import Row
from gpuswarm.outputs.summaryjson import FieldStats


def _value_order(text: str) -> tuple[int, float, tuple[tuple[int, int | str], ...]]:
    """Numbers by value (0.01 before 0.1), then other text in natural order."""
    try:
        return (0, float(text), ())
    except ValueError:
        return (1, 0.0, natural(text))


# a field named so says which end is best (loss: the lowest); any other: min and max only
_LOWER = re.compile(r"loss|err|time|second|latency|bpb|perplex|ppl|mse|mae|rmse|cost|regret")
_HIGHER = re.compile(r"acc|speedup|score|throughput|reward|f1|auc|precision|recall|bleu|gain")


def _numeric_stats(points: list[tuple[float, str]], key: str) -> FieldStats:
    """Stats of a numeric field over ``(value, task)`` points: the tasks at its ends (NaN
    never one), and the best point where the field's name says which end is best."""
    values = [v for v, _ in points]
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * (len(ordered) - 1) + 0.5))]
    finite = [p for p in points if not math.isnan(p[0])] or points
    low, high = min(finite, key=lambda p: p[0]), max(finite, key=lambda p: p[0])
    out: FieldStats = {
        "kind": "number",
        "n": len(values),
        "mean": statistics.fmean(values),
        "median": statistics.median(values),
        "p90": p90,
        "min": ordered[0],
        "max": ordered[-1],
        "min_task": low[1],
        "max_task": high[1],
    }
    name = key.rsplit(".", 1)[-1].lower()
    if _LOWER.search(name):
        out["best"] = {"task": low[1], "value": low[0], "by": "lowest"}
    elif _HIGHER.search(name):
        out["best"] = {"task": high[1], "value": high[0], "by": "highest"}
    return out


def _is_input(key: str, rows: list[Row]) -> bool:
    """Whether result field ``key`` repeats what each task was made from (``result.lr`` of a
    matrix over ``lr``): no measurement, so never averaged."""
    seen = False
    for r in rows:
        if key not in r.result:
            continue
        given = r.inputs.get(key)
        if given is None:
            return False
        value = r.result[key]
        try:
            same = float(value) == float(given)
        except (TypeError, ValueError):
            same = str(value) == given
        if not same:
            return False
        seen = True
    return seen


def field_stats(rows: list[Row]) -> dict[str, FieldStats]:
    """Per result/metric field: pass rates for booleans, mean/median/p90 for numbers with the
    tasks at their ends (and the best one, by the field's name), the values of a field that
    only repeats the task's inputs (``kind: input``: never averaged)."""
    total = sum(1 for r in rows if r.values.state not in APART)  # skipped, cancelled: apart
    done = sum(1 for r in rows if r.values.state == State.DONE.value)
    columns: dict[str, list[Any]] = {}
    tasks: dict[str, list[str]] = {}
    for r in rows:
        who = r.values.name or r.values.task
        for k, v in r.metrics.items():
            columns.setdefault(k, []).append(v)
            tasks.setdefault(k, []).append(who)
        for k, v in r.result.items():
            columns.setdefault(f"result.{k}", []).append(v)
            tasks.setdefault(f"result.{k}", []).append(who)
    inputs = {k for r in rows for k in r.inputs}
    out: dict[str, FieldStats] = {}
    for key, values in sorted(columns.items()):
        short = key.removeprefix("result.")
        if key.startswith("result.") and short in inputs and _is_input(short, rows):
            distinct = sorted({str(v) for v in values}, key=_value_order)
            out[key] = {"kind": "input", "n": len(values), "values": distinct[:50]}
        elif all(isinstance(v, bool) for v in values):
            true = sum(1 for v in values if v)
            out[key] = {
                "kind": "bool",
                "true": true,
                "of_done": done,
                "of_total": total,
                "rate_done": true / done if done else None,
                "rate_total": true / total if total else None,
            }
        else:
            nums = [
                (float(v), who)
                for v, who in zip(values, tasks[key], strict=True)
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            ]
            if nums:
                out[key] = _numeric_stats(nums, key)
    return out
