"""Fixtures of the chaos suite: the CLI in subprocesses, reaping, seeds, trial counts, figures.

- ``GPUSWARM_CHAOS_TRIALS=N``: trials per randomized scenario (defaults are small, for CI);
- ``GPUSWARM_CHAOS_SEED=S``: the base seed (default: random, printed in the report header);
  each trial's own seed is in its test id (``test_x[seed=123]``) and printed in its output;
- ``GPUSWARM_CHAOS_SEEDS=a,b``: replay exactly these trial seeds;
- ``GPUSWARM_CHAOS_STATS=path``: append one JSON line of figures per scenario/trial (the table in
  docs/reliability.md); a summary table is printed at the end of the session either way.

Helpers live in ``harness.py`` and ``invariants.py`` (imported by name: pytest puts this folder
on ``sys.path``), never in this module, so the ``conftest`` of tests/integration cannot shadow
them when both folders are collected together.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, run_cli, start_cli
from harness import BASE_SEED, kill_run_processes
from harness import trial_seeds as _trial_seeds

_FIGURES: list[dict[str, Any]] = []


def pytest_report_header() -> list[str]:
    return [
        f"gpuswarm chaos: base seed {BASE_SEED} (replay: GPUSWARM_CHAOS_SEED={BASE_SEED}), "
        f"trials {os.environ.get('GPUSWARM_CHAOS_TRIALS') or 'default'}"
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking ``seed`` runs once per trial; its default trial count is ``trials=``."""
    if "seed" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("trials")
        default = int(marker.args[0]) if marker else 2
        seeds = _trial_seeds(default, metafunc.definition.name, BASE_SEED)
        metafunc.parametrize("seed", seeds, ids=[f"seed={s}" for s in seeds])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "trials(n): default trial count of a seeded scenario")


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Callable[..., None]:
    """Record the figures of one scenario run (the docs/reliability.md table)."""

    def record(scenario: str, **values: Any) -> None:
        row = {"scenario": scenario, "test": request.node.nodeid, **values}
        _FIGURES.append(row)
        path = os.environ.get("GPUSWARM_CHAOS_STATS")
        if path:
            with open(path, "a") as fh:
                fh.write(json.dumps(row) + "\n")

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    agg: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in _FIGURES:
        a = agg[row["scenario"]]
        a["trials"] += 1
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                peak = k.endswith(("seconds", "_kib", "_mib"))  # the worst trial, not a sum
                a[k] = max(a[k], v) if peak else a[k] + v
    tr = terminalreporter
    tr.write_sep("-", f"chaos figures (base seed {BASE_SEED})")
    for scenario, a in agg.items():
        cells = ", ".join(f"{k}={v:g}" for k, v in a.items())
        tr.write_line(f"{scenario}: {cells}")


@pytest.fixture
def run_reaper(tmp_path: Path) -> Iterator[None]:
    """At teardown, SIGKILL whatever process of a run under tmp_path is left (a failed test)."""
    yield
    kill_run_processes(tmp_path)


@pytest.fixture
def cli(tmp_path: Path, run_reaper: None) -> Callable[..., CliResult]:
    """``cli(*args, timeout=60, env=None)``: run the gpuswarm CLI to its end, in tmp_path."""

    def call(
        *args: str | os.PathLike[str], timeout: float = 60, env: dict[str, str] | None = None
    ) -> CliResult:
        return run_cli(*args, cwd=tmp_path, timeout=timeout, env=env)

    return call


@pytest.fixture
def cli_popen(tmp_path: Path, run_reaper: None) -> Iterator[Callable[..., CliProcess]]:
    """``cli_popen(*args, prefix=None)``: start the CLI in its own session (SIGKILLed at teardown).

    ``prefix`` replaces ``[python, -m, gpuswarm]`` (the crash-point wrapper uses it).
    """
    started: list[CliProcess] = []

    def start(
        *args: str | os.PathLike[str],
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> CliProcess:
        proc = start_cli(
            *args, cwd=tmp_path, log_dir=tmp_path / "_cli_logs", env=env, prefix=prefix
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill_group()


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """The folder where tasks record their side effects (one file per task id)."""
    path = tmp_path / "shared"
    path.mkdir()
    return path


@pytest.fixture
def stopwatch() -> Callable[[], float]:
    t0 = time.monotonic()
    return lambda: time.monotonic() - t0
