"""Repeated attempts (issue 34, ``repeats: k``): per task the mean and 95 % CI of its score,
pass@1 and the unbiased pass@k of its pass/fail field, and the aggregate over tasks.

A repeat that ended failed (or without the field) counts as not passed for pass@k (n is every
repeat that ended) and has no score (the score's n is the repeats that gave one). The unbiased
estimator is Chen et al.'s (2021): ``pass@k = 1 - C(n - c, k) / C(n, k)`` for ``c`` passes of
``n``. A 95 % CI is the mean +- t(0.975, n - 1) * s / sqrt(n) (none for n < 2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict

from gpuswarm.outputs.html import esc, html_table

# t(0.975, df) for df 1..30; above 30 the normal 1.96 is within 2 %
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
SCORED = ("done", "failed")  # the repeats whose score counts (not every ended state)


class MeanCi(TypedDict, total=False):
    """``{n, mean, sd, ci95}`` (``sd`` only for n >= 2; mean and ci95 None when unknown)."""

    n: int
    mean: float | None
    sd: float
    ci95: list[float] | None


class ScoreStats(MeanCi, total=False):
    field: str


PassedStats = TypedDict(  # keys with "@": the functional form
    "PassedStats",
    {"field": str, "n": int, "c": int, "pass@1": float, "pass@k": dict[str, float]},
)


class TaskRepeats(TypedDict, total=False):
    """summary.json's ``repeats.tasks[task]``."""

    repeats: int
    ended: int
    score: ScoreStats
    passed: PassedStats


RepeatsAggregate = TypedDict(
    "RepeatsAggregate",
    {
        "tasks": int,
        "score": MeanCi,
        "pass@1": float,
        "pass@k": dict[str, float],
        "pass@1_ci95": list[float] | None,
    },
    total=False,
)


class RepeatsJson(TypedDict):
    """summary.json's ``repeats``."""

    tasks: dict[str, TaskRepeats]
    aggregate: RepeatsAggregate


class RepeatOf(NamedTuple):
    """A repeat's group, from its spec: the task it repeats, which repeat, its fields."""

    task: str
    j: int
    score: str | None
    passed: str | None


def t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci(values: list[float]) -> MeanCi:
    """``{n, mean, ci95: [low, high] | None, sd}`` of ``values`` (None mean when empty)."""
    n = len(values)
    if not n:
        return {"n": 0, "mean": None, "ci95": None}
    mean = statistics.fmean(values)
    if n < 2:
        return {"n": 1, "mean": mean, "ci95": None}
    sd = statistics.stdev(values)
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "ci95": [mean - half, mean + half]}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of ``c`` passes in ``n`` samples (``k <= n``)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class Repeats:
    """One task's repeats as their rows say."""

    task: str
    score: str | None
    passed: str | None
    states: dict[int, str] = field(default_factory=dict)  # repeat -> state
    scores: dict[int, float] = field(default_factory=dict)
    passes: dict[int, bool] = field(default_factory=dict)

    def stats(self) -> TaskRepeats:
        ended = [j for j, s in self.states.items() if s in SCORED]
        out: TaskRepeats = {"repeats": len(self.states), "ended": len(ended)}
        if self.score is not None:
            out["score"] = {
                "field": self.score,
                **mean_ci([self.scores[j] for j in sorted(self.scores)]),
            }
        if self.passed is not None and ended:
            n, c = len(ended), sum(1 for j in ended if self.passes.get(j) is True)
            out["passed"] = {
                "field": self.passed,
                "n": n,
                "c": c,
                "pass@1": c / n,
                "pass@k": {str(k): pass_at_k(n, c, k) for k in range(1, n + 1)},
            }
        return out


def _value(fields: Iterable[Mapping[str, Any]], name: str) -> Any:
    for d in fields:
        if name in d:
            return d[name]
    return None


def repeat_stats(rows: Iterable[Any]) -> RepeatsJson | None:
    """summary.json's ``repeats``: per task and the aggregate; None without repeated tasks.
    ``rows``: results rows (``repeat``: a :class:`RepeatOf`, ``result``, ``metrics``,
    ``values.state``)."""
    groups: dict[str, Repeats] = {}
    for r in rows:
        if r.repeat is None:
            continue
        rep: RepeatOf = r.repeat
        task, j, score, passed = rep.task, rep.j, rep.score, rep.passed
        g = groups.setdefault(task, Repeats(task, score, passed))
        g.states[j] = r.values.state
        fields = (r.result, r.metrics)
        if score is not None:
            v = _value(fields, score)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                g.scores[j] = float(v)
        if passed is not None:
            p = _value(fields, passed)
            if isinstance(p, bool):
                g.passes[j] = p
    if not groups:
        return None
    tasks = {t: g.stats() for t, g in sorted(groups.items())}
    return {"tasks": tasks, "aggregate": _aggregate(tasks)}


def _aggregate(tasks: dict[str, TaskRepeats]) -> RepeatsAggregate:
    """Over tasks: the mean of their mean scores with its CI (tasks are the samples), the mean
    pass@1, and the mean pass@k for each k every task has."""
    means = [m for s in tasks.values() if (m := s.get("score", {}).get("mean")) is not None]
    out: RepeatsAggregate = {"tasks": len(tasks), "score": mean_ci(means)}
    passed = [s["passed"] for s in tasks.values() if "passed" in s]
    if passed:
        k_all = min(p["n"] for p in passed)
        out["pass@1"] = statistics.fmean(p["pass@1"] for p in passed)
        out["pass@k"] = {
            str(k): statistics.fmean(p["pass@k"][str(k)] for p in passed)
            for k in range(1, k_all + 1)
        }
        out["pass@1_ci95"] = mean_ci([p["pass@1"] for p in passed])["ci95"]
    return out


def repeat_of(task: Mapping[str, Any]) -> RepeatOf | None:
    """A repeat's group from its spec's JSON (task it repeats, which repeat, score field,
    passed field); None when it is mistyped."""
    of, j = task.get("repeat_of"), task.get("repeat")
    score, passed = task.get("score"), task.get("passed")
    if not isinstance(of, str) or not isinstance(j, int) or isinstance(j, bool):
        return None
    return RepeatOf(
        of,
        j,
        score if isinstance(score, str) else None,
        passed if isinstance(passed, str) else None,
    )


def _num(v: Any) -> str:
    return "" if v is None else f"{v:.4g}"


def _ci(ci: Any) -> str:
    return f"[{ci[0]:.4g}, {ci[1]:.4g}]" if isinstance(ci, list) and len(ci) == 2 else ""


def repeats_section(summary: Mapping[str, Any]) -> str:
    """report.html's repeats section: per task and the aggregate (empty without repeats)."""
    reps = summary.get("repeats")
    if not isinstance(reps, Mapping):
        return ""
    agg = reps.get("aggregate") or {}
    score = agg.get("score") or {}
    line = f"{esc(agg.get('tasks'))} tasks"
    if score.get("mean") is not None:
        line += f"; mean score {_num(score['mean'])}, 95 % CI {_ci(score.get('ci95'))}"
    if agg.get("pass@1") is not None:
        ks = ", ".join(f"pass@{k} {_num(v)}" for k, v in (agg.get("pass@k") or {}).items())
        line += f"; {esc(ks)} (unbiased estimator, mean over tasks)"
    rows = []
    for task, st in (reps.get("tasks") or {}).items():
        sc, ps = st.get("score") or {}, st.get("passed") or {}
        pk = ps.get("pass@k") or {}
        top = pk.get(str(ps.get("n"))) if ps else None
        rows.append({"task": task, "repeats ended": st.get("ended"),
                     "mean score": _num(sc.get("mean")), "95 % CI": _ci(sc.get("ci95")),
                     "passed": ps.get("c", ""), "pass@1": _num(ps.get("pass@1")),
                     "pass@n": _num(top)})  # fmt: skip
    columns = ("task", "repeats ended", "mean score", "95 % CI", "passed", "pass@1", "pass@n")
    return f"<h2>Repeats</h2>\n<p>{line}</p>\n" + html_table(columns, rows) + "\n"
