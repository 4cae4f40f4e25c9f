"""Generic helpers for integration tests that drive the real ``gpuswarm`` CLI in subprocesses.

Fixtures (all function scoped):

- ``gpuswarm(*args, cwd=None, input=None, timeout=60, env=None) -> CliResult``: run the CLI to
  the end (``[sys.executable, "-m", "gpuswarm", *args]``), default cwd ``tmp_path``.
- ``gpuswarm_popen(*args, cwd=None, env=None) -> CliProcess``: start the CLI in its own session
  and process group (so a signal reaches only what the test aims at); stdout/stderr go to files.
  At teardown anything still running is SIGKILLed (the whole group) and waited for.
- ``run_reaper``: at teardown, SIGKILLs every process whose environment has a
  ``GPUSWARM_RUN_DIR`` under ``tmp_path`` (tasks orphaned by a killed supervisor), so one failing
  test never leaves sleepers behind for the next.

Plain helpers are in ``tests/helpers/integration_support.py`` (imported by name: a module named
``conftest`` exists once per test folder, so nothing imports it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, run_cli, start_cli
from integration_support import kill_run_processes, make_research_repo


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture
def run_reaper(tmp_path: Path) -> Iterator[None]:
    yield
    kill_run_processes(tmp_path)


@pytest.fixture
def gpuswarm(tmp_path: Path, run_reaper: None) -> Callable[..., CliResult]:
    def call(
        *args: str | os.PathLike[str],
        cwd: Path | None = None,
        input: str | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
    ) -> CliResult:
        return run_cli(*args, cwd=cwd or tmp_path, input=input, timeout=timeout, env=env)

    return call


@pytest.fixture
def gpuswarm_popen(tmp_path: Path, run_reaper: None) -> Iterator[Callable[..., CliProcess]]:
    started: list[CliProcess] = []

    def start(
        *args: str | os.PathLike[str], cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> CliProcess:
        proc = start_cli(*args, cwd=cwd or tmp_path, log_dir=tmp_path / "_cli_logs", env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill_group()


@pytest.fixture
def research_repo(tmp_path: Path, run_reaper: None) -> Path:
    return make_research_repo(tmp_path / "repo")
