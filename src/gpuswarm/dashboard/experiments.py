"""A research experiment as the dashboard shows it: the replay of its ledger (the research
package's own ``journal.replay``, never a second reading of the ledger), its core run's
:class:`~gpuswarm.dashboard.runhub.RunHub` for the variants in flight on each GPU, and each
variant's diff against its parent (``gitops.diff_text``).

The dashboard only reads: it never settles an experiment (recording a finished variant is a
research command's or the loop's job), so a variant whose run ended but that no command has
recorded yet is shown as ``ended``, waiting to be recorded.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from gpuswarm.app import api
from gpuswarm.core.errors import ResearchError
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import inert, redact_shapes
from gpuswarm.dashboard.payloads import (
    ExperimentHeader,
    ExperimentSnapshot,
    InFlightLine,
    ResultLine,
    SlotPlace,
    VariantDiff,
)
from gpuswarm.dashboard.runhub import RunHub
from gpuswarm.research import gitops
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, load_settings
from gpuswarm.research.figures import figures
from gpuswarm.research.journal import ExperimentState, replay
from gpuswarm.research.plot import running_best
from gpuswarm.research.readouts import best_recorded, plot_rows

_VARIANT_RE = re.compile(r"^v\d{4,}$")


def is_experiment(folder: Path) -> bool:
    return (folder / "experiment.json").is_file()


class ExperimentHub:
    """One experiment followed: re-replayed when its ledger grows (one stat per tick)."""

    def __init__(self, exp_id: str, root: Path, run_hub_id: str) -> None:
        self.id = exp_id
        self.paths = ExpPaths(repo=root.parent.parent.parent, root=root)
        self.cfg: ExperimentConfig = load_settings(self.paths)
        self.run_paths = RunPaths(root / self.cfg.run)
        self.run_id = run_hub_id
        self.lock = threading.Lock()
        self.version = 0
        self._size = -1
        self.state = ExperimentState()
        self.poll()

    def poll(self) -> bool:
        """Replay the ledger when it grew; whether it did."""
        try:
            size = self.paths.ledger.stat().st_size
        except FileNotFoundError:
            size = 0
        if size == self._size:
            return False
        state = replay(self.paths)
        with self.lock:
            self.state, self._size = state, size
            self.version += 1
        return True

    @property
    def position(self) -> int:
        return self._size

    def header(self, run: RunHub | None) -> ExperimentHeader:
        with self.lock:
            state = self.state
        best = best_recorded(self.cfg, state)
        return {
            "id": self.id,
            "kind": "experiment",
            "title": self.cfg.tag,
            "path": str(self.paths.root),
            "repo": str(self.paths.repo),
            "branch": self.cfg.branch,
            "metric": self.cfg.metric,
            "goal": self.cfg.goal,
            "base": gitops.short(state.base) if state.base else "",
            "best_recorded": best,
            **figures(state).view(),  # baseline, best, experiments, kept: one definition
            "in_flight": len(state.in_flight()),
            "run": self.run_id,
            "live": bool(run and run.live),
            "state": run.state if run else "",
        }

    def snapshot(self, run: RunHub | None) -> ExperimentSnapshot:
        with self.lock:
            state = self.state
        rows: list[ResultLine] = []
        for n, (vid, row) in enumerate(zip(state.row_ids, state.rows, strict=False), 1):
            v = state.variants.get(vid)
            r = dict(zip(TSV_COLUMNS, row, strict=False))  # its cells by column name
            rows.append(
                {
                    "n": n,
                    "id": vid,
                    "commit": r["commit"],
                    "metric": None if r["status"] in ("crash", "pruned") else _number(r["metric"]),
                    "memory_gb": _number(r["memory_gb"]),
                    "status": r["status"],
                    "description": inert(redact_shapes(r["description"])),
                    "kind": v.kind if v else "",
                    "reason": inert(redact_shapes(str((v.decision or {}).get("reason") or "")))
                    if v
                    else "",
                }
            )
        return {
            "pos": self.position,
            "view": {
                **self.header(run),
                "rows": rows,
                "best_steps": self._best_steps(state),
                "in_flight": self._in_flight(state, run),
            },
        }

    def _best_steps(self, state: ExperimentState) -> list[list[float]]:
        """progress.png's running best (``plot.running_best``: BASE's metric after each keep)
        as [experiment number, value] steps of the snapshot's rows."""
        with_rows = set(state.row_ids)
        plotted = [vid for vid in state.variants if vid in with_rows]  # plot_rows' order
        number = {vid: n for n, vid in enumerate(state.row_ids, 1)}
        xs, ys = running_best(plot_rows(state), self.cfg.goal)
        return [[number[plotted[x - 1]], y] for x, y in zip(xs, ys, strict=False)]

    def _in_flight(self, state: ExperimentState, run: RunHub | None) -> list[InFlightLine]:
        """The variants not recorded yet: where each is (its GPU slot and since when while it
        runs, queued, or ended and waiting to be recorded)."""
        where: dict[str, SlotPlace] = {}
        ended: set[str] = set()
        if run is not None:
            with run.view.lock:
                for label, row in run.view.slots.items():
                    if row.task:
                        where[row.task] = {"slot": label, "since": row.since}
        if state.in_flight():  # the ended folders of a research run: a few names
            ended = api.finished_ids(self.run_paths)
        out: list[InFlightLine] = []
        for v in state.in_flight():
            place = where.get(v.id)
            status = "running" if place else ("ended" if v.id in ended else "queued")
            out.append(
                {
                    "id": v.id,
                    "kind": v.kind,
                    "commit": gitops.short(v.commit),
                    "description": inert(redact_shapes(v.description)),
                    "round": v.round,
                    "status": status,
                    "slot": place["slot"] if place else None,
                    "since": place["since"] if place else None,
                    "timeout": self.cfg.timeout,
                }
            )
        return out

    def diff(self, vid: str) -> VariantDiff:
        """The variant's change against its parent (a unified diff, cut near 200 kB)."""
        if not _VARIANT_RE.match(vid):
            raise ResearchError(f"{vid!r} is not a variant id (they look like v0007)")
        with self.lock:
            v = self.state.variants.get(vid)
        if v is None:
            raise ResearchError(f"no variant {vid} in experiment {self.cfg.tag}")
        started = time.monotonic()
        text = gitops.diff_text(self.paths.repo, v.parent, v.commit, max_bytes=200_000)
        fin = v.finished or {}
        return {
            "id": v.id,
            "kind": v.kind,
            "commit": v.commit,
            "parent": v.parent,
            "description": inert(redact_shapes(v.description)),
            "status": v.status,
            "metric": fin.get("metric"),
            "reason": inert(redact_shapes(str((v.decision or {}).get("reason") or ""))),
            "diff": redact_shapes(text),
            "seconds": round(time.monotonic() - started, 3),
        }


#: results.tsv's first five columns (research/settle.py ``HEADER``; the metric's is named after
#: the experiment's metric there)
TSV_COLUMNS = ("commit", "metric", "memory_gb", "status", "description")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
