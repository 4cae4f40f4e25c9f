"""One research experiment's figures for ``/metrics``: the replay of its ledger (the research
package's own ``journal.replay``), done again only when the ledger grew (one stat a scrape)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, load_settings
from gpuswarm.research.figures import energy_figures, figures
from gpuswarm.research.journal import ExperimentState, replay
from gpuswarm.research.readouts import best_recorded
from gpuswarm.research.rules import noise

#: the results.tsv statuses (label ``status``): a bounded set
STATUSES = ("keep", "discard", "crash", "pruned")  # pruned: issue 38


@dataclass
class ExperimentFigures:
    tag: str
    goal: str
    by_status: dict[str, int] = field(default_factory=dict)
    base_metric: float | None = None  # BASE's metric now (what the policy kept)
    baseline_metric: float | None = None  # the first BASE's
    best_metric: float | None = None  # the best any run measured
    noise_sigma: float | None = None
    kept: int = 0
    in_flight: int = 0
    energy_j: float | None = None  # GPU energy of the recorded runs (issue 37)


class ExperimentStats:
    def __init__(self, root: Path) -> None:
        self.paths = ExpPaths(repo=root.parent.parent.parent, root=root)
        self.cfg: ExperimentConfig = load_settings(self.paths)
        self._size = -1
        self._lock = threading.Lock()
        self.figures = ExperimentFigures(self.cfg.tag, self.cfg.goal)

    def refresh(self) -> None:
        with self._lock:
            try:
                size = self.paths.ledger.stat().st_size
            except FileNotFoundError:
                size = 0
            if size != self._size:
                self.figures = self._figures(replay(self.paths))
                self._size = size

    def _figures(self, state: ExperimentState) -> ExperimentFigures:
        fig = figures(state)
        by_status = dict.fromkeys(STATUSES, 0)
        for row in state.results():
            status = row.status if row.status in STATUSES else "discard"
            by_status[status] += 1
        best = best_recorded(self.cfg, state)
        est = noise(state)
        return ExperimentFigures(
            tag=self.cfg.tag,
            goal=self.cfg.goal,
            by_status=by_status,
            base_metric=state.best,
            baseline_metric=fig.baseline,
            best_metric=None if best is None else float(best["metric"]),
            noise_sigma=None if est is None else est.sigma,
            kept=fig.kept,
            in_flight=len(state.in_flight()),
            energy_j=energy_figures(state)["energy_j"],
        )
