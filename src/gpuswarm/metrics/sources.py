"""The runs and experiments ``/metrics`` reports: those under the PATHs given (a run folder, a
workspace of runs, a research experiment, or a repository holding experiments), found again
at most every :data:`RESCAN_SECONDS` so that runs started later appear."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from gpuswarm.core.errors import BadInputError, GpuswarmError
from gpuswarm.core.paths import RunPaths, find_runs
from gpuswarm.metrics.research import ExperimentStats
from gpuswarm.metrics.runstats import RunStats
from gpuswarm.research.experiment import EXPERIMENTS

RESCAN_SECONDS = 2.0


class NoSuchPathError(BadInputError):
    """A PATH given to ``gpuswarm exporter`` does not exist."""


def check_paths(paths: Sequence[Path]) -> list[Path]:
    """The PATHs resolved; NoSuchPathError naming the first that is no folder."""
    out = []
    for path in paths:
        if not path.is_dir():
            raise NoSuchPathError(
                f"{path}: no such folder; pass a run folder, a workspace of runs (default "
                "./runs) or a research experiment (.gpuswarm/research/<tag>)"
            )
        out.append(path.resolve())
    return out


def _is_experiment(folder: Path) -> bool:
    return (folder / "experiment.json").is_file()


def _found(root: Path) -> tuple[list[Path], list[Path]]:
    """(run folders, experiment folders) under ``root``."""
    if RunPaths(root).is_run():
        return [root], []
    if _is_experiment(root):
        return [], [root]
    if (root / EXPERIMENTS).is_dir():
        exps = sorted(p for p in (root / EXPERIMENTS).iterdir() if _is_experiment(p))
        return [], exps
    return find_runs(root), []


def run_label(run: Path) -> str:
    """A run's ``run`` label: ``<name>/<run folder>`` (one value per run: bounded by runs)."""
    return f"{run.parent.name}/{run.name}"


class Sources:
    """What is reported, kept up to date at each :meth:`refresh` (a scrape)."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = list(roots)
        self.runs: dict[Path, RunStats] = {}
        self.experiments: dict[Path, ExperimentStats] = {}
        self.errors: dict[str, str] = {}
        self._scanned = -1e9
        self._lock = threading.Lock()

    def refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._scanned >= RESCAN_SECONDS:
                self._scan()
                self._scanned = time.monotonic()
            for path, stats in list(self.runs.items()):
                self._guard(str(path), stats.refresh)
            for path, exp in list(self.experiments.items()):
                self._guard(str(path), exp.refresh)

    def _guard(self, key: str, fn: object) -> None:
        """One unreadable run or experiment must not fail the scrape of the others."""
        assert callable(fn)
        try:
            fn()
            self.errors.pop(key, None)
        except (OSError, ValueError, GpuswarmError) as exc:
            self.errors[key] = str(exc)

    def _scan(self) -> None:
        for gone in [p for p in self.runs if not p.is_dir()]:  # removed (gpuswarm clean)
            del self.runs[gone]
            self.errors.pop(str(gone), None)
        for gone in [p for p in self.experiments if not p.is_dir()]:
            del self.experiments[gone]
            self.errors.pop(str(gone), None)
        for root in self.roots:
            runs, exps = _found(root)
            for exp in exps:
                if exp not in self.experiments:
                    self._add_experiment(exp)
            for run in runs:
                if run not in self.runs:
                    self._guard(str(run), lambda r=run: self._add_run(r, run_label(r)))

    def _add_run(self, run: Path, label: str) -> None:
        self.runs[run] = RunStats(RunPaths(run), label)

    def _add_experiment(self, root: Path) -> None:
        def add() -> None:
            stats = ExperimentStats(root)
            self.experiments[root] = stats
            core = root / stats.cfg.run
            if RunPaths(core).is_run() and core not in self.runs:  # its variants' run
                self._add_run(core, f"{stats.cfg.tag}/{core.name}")

        self._guard(str(root), add)
