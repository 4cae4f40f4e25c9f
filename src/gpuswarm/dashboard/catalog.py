"""What a dashboard shows: the runs and experiments under the PATHs it was given, found again
every few seconds so that runs started after it appear.

A PATH is a run folder, a workspace of runs (``<workspace>/<name>/run_*``, as ``gpuswarm ls``
finds them), a research experiment (``.gpuswarm/research/<tag>``) or a repository holding
experiments. Each run and experiment gets an id, a digest of its folder's path, stable across
restarts of the dashboard (a bookmarked page still works).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from gpuswarm.core.errors import BadInputError, GpuswarmError
from gpuswarm.core.paths import RunPaths, find_runs
from gpuswarm.dashboard.experiments import ExperimentHub, is_experiment
from gpuswarm.dashboard.payloads import RunHeader
from gpuswarm.dashboard.runhub import RunHub
from gpuswarm.research.experiment import EXPERIMENTS, ExpPaths, load_settings

RESCAN_SECONDS = 2.0


class Listing(TypedDict):
    """The runs page's data (``/api/runs``): every run's line, newest first, every
    experiment's, the PATHs given and the folders that cannot be shown (and why)."""

    runs: list[RunHeader]
    experiments: list[Mapping[str, object]]  # ExperimentHub.header's lines
    roots: list[str]
    problems: dict[str, str]


class RunsPage(Listing):
    """The listing as the server answers it: with whether the dashboard is read-only."""

    read_only: bool


class NoSuchPathError(BadInputError):
    """A PATH given to ``gpuswarm dashboard`` does not exist or holds nothing to show."""


@dataclass(frozen=True)
class Root:
    """A PATH as given, and what it is: run, experiment, repo or workspace."""

    path: Path
    kind: str


def classify(path: Path) -> Root:
    """What ``path`` is; NoSuchPathError naming it when it does not exist."""
    if not path.exists():
        raise NoSuchPathError(
            f"{path}: no such folder; pass a run folder, a workspace of runs (default ./runs) "
            "or a research experiment (.gpuswarm/research/<tag>)"
        )
    path = path.resolve()
    if not path.is_dir():
        raise NoSuchPathError(
            f"{path}: not a folder; pass a run folder, a workspace or an experiment"
        )
    if RunPaths(path).is_run():
        return Root(path, "run")
    if is_experiment(path):
        return Root(path, "experiment")
    if (path / EXPERIMENTS).is_dir():
        return Root(path, "repo")
    return Root(path, "workspace")


def ident(prefix: str, path: Path) -> str:
    return prefix + hashlib.sha256(str(path).encode()).hexdigest()[:10]


class Catalog:
    """Every run and experiment of the roots, each with its hub (thread-safe)."""

    def __init__(self, roots: Sequence[Root]) -> None:
        self.roots = list(roots)
        self.lock = threading.Lock()
        self.runs: dict[str, RunHub] = {}
        self.experiments: dict[str, ExperimentHub] = {}
        self.problems: dict[str, str] = {}  # folder -> why it cannot be shown
        self.version = 0

    def _found(self) -> tuple[list[Path], list[Path]]:
        runs: list[Path] = []
        exps: list[Path] = []
        for root in self.roots:
            if root.kind == "run":
                runs.append(root.path)
            elif root.kind == "experiment":
                exps.append(root.path)
            elif root.kind == "repo":
                folder = root.path / EXPERIMENTS
                exps += sorted(p for p in folder.iterdir() if is_experiment(p))
                runs += find_runs(root.path / "runs")
            else:
                runs += find_runs(root.path)
                if (root.path / EXPERIMENTS).is_dir():
                    exps += sorted(
                        p for p in (root.path / EXPERIMENTS).iterdir() if is_experiment(p)
                    )
        return runs, exps

    def scan(self) -> bool:
        """Look for runs and experiments not seen yet; whether any appeared."""
        try:
            runs, exps = self._found()
        except OSError:
            return False
        added = self._forget_removed()
        for folder in exps:
            eid = ident("x", folder)
            if eid in self.experiments:
                continue
            try:
                hub = self._experiment(eid, folder)
            except (GpuswarmError, OSError, ValueError) as exc:
                self.problems[str(folder)] = str(exc)
                continue
            with self.lock:
                self.experiments[eid] = hub
                self.problems.pop(str(folder), None)
            added = True
        for folder in runs:
            added = self._add_run(folder) or added
        if added:
            with self.lock:
                self.version += 1
        return added

    def _forget_removed(self) -> bool:
        """Drop the runs and experiments whose folder is gone (``gpuswarm clean``, rm -r)."""
        with self.lock:
            gone = [rid for rid, h in self.runs.items() if not h.paths.run_json.exists()]
            gone_x = [x for x, h in self.experiments.items() if not h.paths.config.exists()]
            for rid in gone:
                del self.runs[rid]
            for x in gone_x:
                del self.experiments[x]
        return bool(gone or gone_x)

    def _experiment(self, eid: str, folder: Path) -> ExperimentHub:
        cfg = load_settings(ExpPaths(folder.parent.parent.parent, folder))
        run_folder = folder / cfg.run
        rid = ident("r", run_folder)
        if RunPaths(run_folder).is_run():
            self._add_run(run_folder, title=f"research {cfg.tag}", experiment=eid)
        return ExperimentHub(eid, folder, rid)

    def _add_run(self, folder: Path, *, title: str = "", experiment: str = "") -> bool:
        rid = ident("r", folder)
        if rid in self.runs:
            return False
        try:
            hub = RunHub(rid, RunPaths(folder), title=title)
        except (GpuswarmError, OSError, ValueError) as exc:
            self.problems[str(folder)] = str(exc)
            return False
        hub.experiment = experiment
        with self.lock:
            self.runs[rid] = hub
            self.problems.pop(str(folder), None)
        return True

    def run(self, rid: str) -> RunHub | None:
        with self.lock:
            return self.runs.get(rid)

    def experiment(self, eid: str) -> ExperimentHub | None:
        with self.lock:
            return self.experiments.get(eid)

    def hubs(self) -> tuple[list[RunHub], list[ExperimentHub]]:
        with self.lock:
            return list(self.runs.values()), list(self.experiments.values())

    def listing(self) -> Listing:
        """The runs page: every run's header (newest first) and every experiment's."""
        runs, exps = self.hubs()
        by_id = {h.id: h for h in runs}
        rows = sorted((h.header() for h in runs), key=lambda r: str(r["folder"]), reverse=True)
        for row in rows:
            row["experiment"] = by_id[str(row["id"])].experiment
        return {
            "runs": rows,
            "experiments": [e.header(by_id.get(e.run_id)) for e in exps],
            "roots": [str(r.path) for r in self.roots],
            "problems": dict(self.problems),
        }
