"""A retry or requeue re-judges a dependent's prerequisites (issue 35): a dependent brought back
while a prerequisite is not ended (it was requeued and is pending again) goes to blocked/, never
pending/ (journaled), through ``gpuswarm retry``, ``gpuswarm requeue`` and resume's retry of
failed tasks; an ``after_failed:`` dependent that ended skipped comes back to blocked/ when
its prerequisite is requeued, as dependency_failed ones do.

Order is proven by effects: ``b`` fails unless ``a`` has run twice.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, read_events
from depkit import deps_yaml as _yaml
from depkit import run_dir as _run_dir
from depkit import task_states

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]


TASKS: list[dict[str, Any]] = [
    {"name": "a", "command": "echo x >> runs_a", "shell": True},
    {"name": "b", "command": "test $(wc -l < runs_a) -ge 2", "shell": True, "after": "a"},
    {"name": "c", "command": "true", "after_failed": "a"},
    {"name": "d", "command": "true", "after": "a"},
]


def _moves(run: Path, task: str) -> set[tuple[str, str]]:
    return {
        (str(e["frm"]), str(e["state"]))
        for e in read_events(run)
        if e.get("ev") == "dependency" and e.get("task") == task
    }


def test_retry_and_requeue_of_a_dependent_wait_for_its_requeued_prerequisite(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    _yaml(tmp_path / "r.yaml", TASKS)
    assert gpuswarm("run", "-q", "--no-report", "r.yaml").returncode == 1
    run = _run_dir(tmp_path)
    assert task_states(run) == {"a": "done", "b": "failed", "c": "skipped", "d": "done"}
    assert gpuswarm("requeue", run, "a").returncode == 0
    assert task_states(run)["c"] == "blocked"  # skipped after_failed dependent: back
    assert ("skipped", "blocked") in _moves(run, "c")
    res = gpuswarm("retry", run, "b")
    assert res.returncode == 0, res
    res = gpuswarm("requeue", run, "d")
    assert res.returncode == 0, res
    assert task_states(run) == {"a": "pending", "b": "blocked", "c": "blocked", "d": "blocked"}
    assert ("failed", "blocked") in _moves(run, "b")
    assert ("done", "blocked") in _moves(run, "d")
    assert gpuswarm("resume", "-q", "--no-report", run).returncode == 0
    assert task_states(run) == {"a": "done", "b": "done", "c": "skipped", "d": "done"}
    assert "consistent" in gpuswarm("check", run).stdout


def test_resume_retry_failed_blocks_a_dependent_of_a_pending_prerequisite(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    _yaml(tmp_path / "r.yaml", TASKS[:2])
    assert gpuswarm("run", "-q", "--no-report", "r.yaml").returncode == 1
    run = _run_dir(tmp_path)
    assert gpuswarm("requeue", run, "a").returncode == 0
    assert task_states(run) == {"a": "pending", "b": "failed"}
    assert gpuswarm("resume", "-q", "--no-report", run).returncode == 0  # retries failed ones
    assert ("pending", "blocked") in _moves(run, "b")
    assert task_states(run) == {"a": "done", "b": "done"}
    assert "consistent" in gpuswarm("check", run).stdout
