"""Issue 11 (semantics on real workloads): completion files, the breaker, finished work, preflight,
skipped tasks, after_all, one run per GPU, and what status / ls / watch / the summary say.

Every test drives the real CLI on simulated GPUs and judges by what is on disk and printed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import CliProcess, CliResult, read_events, task_states

pytestmark = pytest.mark.slow

PY = sys.executable
Gs = Callable[..., CliResult]
Popen = Callable[..., CliProcess]


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def summary_of(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def only_run(workspace: Path) -> Path:
    runs = sorted(p for p in workspace.glob("*/run_*") if (p / "run.json").is_file())
    assert len(runs) == 1, runs
    return runs[0]


# -- item 1: a stale completion file never counts ------------------------------------------------
def test_a_completion_file_shipped_in_the_task_folder_is_not_done(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    for name in ("ships", "writes"):
        folder = tmp_path / "tasks" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text("kind: test\n")
    old = tmp_path / "tasks" / "ships" / "report.yaml"
    old.write_text("passed: true\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    # AKA's flow: copy the task folder into the workspace (times kept), then run the agent,
    # which here writes the report only for 'writes'
    cmd = (
        "cp -a {task_dir}/. {workspace}/ && "
        "if [ {task_rel} = writes ]; then echo 'passed: true' > {workspace}/report.yaml; fi"
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "stale",
            "gpus": "sim:2",
            "defaults": {"done_when": "report.yaml"},
            "tasks": [{"glob": "tasks/*/config.yaml", "command": cmd, "shell": True}],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    assert task_states(run) == {"ships": "failed", "writes": "done"}
    assert "not written by this attempt" in summary_of(run)["failures"][0]["reason"]


def test_a_completion_file_left_by_an_earlier_attempt_is_moved_aside(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    # attempt 1 writes its report and then fails; attempt 2 exits 0 without writing one
    cmd = "if [ {attempt} = 1 ]; then echo 'passed: true' > {workspace}/r.yaml; exit 1; fi; exit 0"
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "stale2",
            "gpus": "sim:1",
            "reliability": {"retry_backoff": None},
            "tasks": [
                {
                    "name": "t",
                    "command": cmd,
                    "shell": True,
                    "done_when": "r.yaml",
                    "max_attempts": 2,
                }
            ],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    assert task_states(run) == {"t": "failed"}
    kept = run / "tasks" / "t" / "attempt-2" / "stale-r.yaml"
    assert kept.read_text() == "passed: true\n"  # kept, never deleted
    assert not (run / "tasks" / "t" / "r.yaml").exists()
    (ev,) = [e for e in read_events(run) if e["ev"] == "stale_result"]
    assert ev["task"] == "t" and ev["attempt"] == 2
    assert ev["moved_to"] == "tasks/t/attempt-2/stale-r.yaml"
