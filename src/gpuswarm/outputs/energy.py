"""GPU energy in the outputs (issue 37): a task's joules over its attempts (results.tsv),
the run's totals (summary.json) and the report's section. What an attempt's ``energy_j`` is
and how a shared GPU's is apportioned: ``placement/energy.py``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypedDict

from gpuswarm.core.models import Descriptor
from gpuswarm.outputs.html import esc
from gpuswarm.outputs.taskrow import TaskRow


def energy_of(desc: Descriptor) -> tuple[float | str, str]:
    """A task's GPU energy over its attempts (issue 37): joules (its row's ``energy_j``), and
    shared when any attempt's was apportioned (``energy_mode``); "" where none was measured."""
    measured = [a for a in desc.attempts if a.energy_j is not None]
    if not measured:
        return "", ""
    shared = any(a.energy_mode == "shared" for a in measured)
    return round(sum(float(a.energy_j or 0) for a in measured), 3), (
        "shared" if shared else "exclusive"
    )


ENERGY_RULE = (
    "NVML's total-energy counter (else the power draw integrated) per look; a GPU's energy "
    "in an interval is split between the attempts on it by the GPU memory each held "
    "(equally when none held any): exclusive when an attempt had its GPUs alone, else shared"
)


class Valued(Protocol):
    """A result row (outputs/results.py ``Row``): its values by column."""

    values: TaskRow


class EnergyStats(TypedDict, total=False):
    """summary.json's ``energy`` (the totals once a task was measured)."""

    measured: int
    of_total: int
    total_j: float
    exclusive_j: float
    shared_j: float
    rule: str


def energy_stats(rows: Sequence[Valued]) -> EnergyStats:
    """GPU energy over the tasks (issue 37): how many were measured, the total and the split
    by mode (joules), and the rule that apportions a shared GPU's."""
    total = {"exclusive": 0.0, "shared": 0.0}
    measured = 0
    for r in rows:
        j, mode = r.values.energy_j, r.values.energy_mode
        if isinstance(j, int | float) and not isinstance(j, bool) and mode in total:
            measured += 1
            total[str(mode)] += float(j)
    out: EnergyStats = {"measured": measured, "of_total": len(rows)}
    if measured:
        out["total_j"] = round(sum(total.values()), 3)
        out["exclusive_j"] = round(total["exclusive"], 3)
        out["shared_j"] = round(total["shared"], 3)
        out["rule"] = ENERGY_RULE
    return out


def energy_section(summary: Mapping[str, Any]) -> str:
    """The report's energy line and its rule; empty when nothing was measured."""
    stats = summary.get("energy") or {}
    if not stats.get("measured"):
        return ""
    total = float(stats.get("total_j") or 0)
    excl = float(stats.get("exclusive_j") or 0)
    shared = float(stats.get("shared_j") or 0)
    return (
        "<h2>GPU energy</h2>\n"
        f"<p>{total:,.0f} J ({total / 3.6e6:.4f} kWh) over {esc(stats.get('measured'))} of "
        f"{esc(stats.get('of_total'))} tasks measured: {excl:,.0f} J exclusive, "
        f"{shared:,.0f} J shared</p>\n"
        f"<p class=note>{esc(stats.get('rule'))}</p>\n"
    )
