"""The experiment's headline numbers, defined once.

Every view (the loop's and the demo's last lines, ``research status``, the live header,
report.html, progress.png and the dashboard) takes these from :func:`figures`, so that no two
of them disagree:

- **baseline**: the first BASE's metric as the policy measured it (the mean of its repeated
  baseline runs), not one of its runs;
- **best**: BASE's metric now (a keep confirmed by re-runs: the mean of its runs), never the
  luckiest single run (``best_recorded`` in status says what the best run measured);
- **kept**: changes that became BASE (variants and re-based combinations); the results.tsv
  rows marked ``keep`` also count baseline runs and confirmation re-runs;
- **experiments**: results.tsv rows; **crashed**: rows marked ``crash``;
- **re-based**: a would-be keep measured on an older BASE, measured again as a combination
  (results.tsv says ``discard``, as the seed's three statuses allow; the views say re-based);
- **modes**: the mode(s) the variants were made in (a loop's mode applies to that loop only,
  so the experiment's setting afterwards may differ);
- **pruned**: rows marked ``pruned`` (issue 38: stopped early by ``research loop --prune``;
  never a crash, never BASE); **gpu_saved_s**: the GPU seconds they did not spend, each a full
  run of its BASE (the median of BASE's runs) less what it ran, as recorded when it ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuswarm.research.journal import ExperimentState, Variant
from gpuswarm.research.payloads import EnergyFigures, FiguresView

CHANGES = ("variant", "combo")


@dataclass(frozen=True)
class Figures:
    baseline: float | None
    best: float | None
    experiments: int
    kept: int
    crashed: int
    rebased: int
    modes: str
    pruned: int = 0
    gpu_saved_s: float = 0.0

    def view(self) -> FiguresView:
        return {
            "baseline": self.baseline,
            "best": self.best,
            "experiments": self.experiments,
            "kept": self.kept,
            "crashed": self.crashed,
            "rebased": self.rebased,
            "modes": self.modes,
            "pruned": self.pruned,
            "gpu_saved_s": self.gpu_saved_s,
        }


def first_base(state: ExperimentState) -> str | None:
    """The commit the experiment started from (its first baseline's)."""
    return next((v.commit for v in state.variants.values() if v.kind == "baseline"), None)


def rebased(state: ExperimentState, v: Variant) -> bool:
    """``v`` was a would-be keep measured again on BASE as a combination."""
    return (
        v.decision is not None
        and v.decision.get("status") == "discard"
        and any(c.kind == "combo" and c.origin == v.id for c in state.variants.values())
    )


def shown_status(state: ExperimentState, v: Variant) -> str:
    """The status the views print: results.tsv's, with ``re-based`` for a re-based one."""
    return "re-based" if rebased(state, v) else v.status


def figures(state: ExperimentState) -> Figures:
    first = first_base(state)
    modes = list(dict.fromkeys(v.mode for v in state.variants.values() if v.kind in CHANGES))
    return Figures(
        baseline=None if first is None else state.base_metric.get(first),
        best=state.best,
        experiments=len(state.rows),
        kept=sum(1 for v in state.variants.values() if v.kind in CHANGES and v.status == "keep"),
        crashed=sum(1 for r in state.results() if r.status == "crash"),
        rebased=sum(1 for v in state.variants.values() if rebased(state, v)),
        modes=", ".join(m for m in modes if m) or state.mode,
        pruned=sum(1 for r in state.results() if r.status == "pruned"),
        gpu_saved_s=saved_seconds(state),
    )


def saved_seconds(state: ExperimentState) -> float:
    """GPU seconds the pruned runs did not spend (``saved_s`` of each, as recorded)."""
    total = 0.0
    for v in state.variants.values():
        fin = v.finished or {}
        s = fin.get("saved_s")
        if fin.get("pruned") and isinstance(s, int | float) and not isinstance(s, bool):
            total += float(s)
    return round(total, 1)


def energy_figures(state: ExperimentState) -> EnergyFigures:
    """Issue 37: the GPU energy of every recorded run (J) and per kept improvement (all of it
    over the changes kept: what an improvement cost); None where nothing was measured."""
    joules = [
        float(j)
        for v in state.variants.values()
        if isinstance(j := (v.finished or {}).get("energy_j"), int | float)
        and not isinstance(j, bool)
    ]
    kept = sum(1 for v in state.variants.values() if v.kind in CHANGES and v.status == "keep")
    total = round(sum(joules), 3) if joules else None
    per_kept = round(total / kept, 3) if total is not None and kept else None
    return {"energy_j": total, "energy_measured": len(joules), "energy_per_kept_j": per_kept}
