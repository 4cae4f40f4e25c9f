"""Issue 28 (trust on real workloads, round 2), items 2 and 6: a completion file copied from the
task's source folder never counts, and what a task prints while no supervisor reads reaches its
log and its metrics. Item 5 (a supervisor's death costs no attempt) is in
tests/chaos/test_supervisor_death.py.

Every test drives the real CLI on simulated GPUs and judges by what is on disk.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_driver import CliProcess, CliResult, env_processes, read_events, wait_for, wait_for_run
from integration_support import descriptor, task_states

pytestmark = pytest.mark.slow

PY = sys.executable
Gs = Callable[..., CliResult]
Popen = Callable[..., CliProcess]


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def only_run(workspace: Path) -> Path:
    runs = sorted(p for p in workspace.glob("*/run_*") if (p / "run.json").is_file())
    assert len(runs) == 1, runs
    return runs[0]


def summary_of(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


# -- item 2: a completion file copied with `cp -r` is no result ----------------------------------
def test_a_completion_file_copied_with_new_times_is_not_done(tmp_path: Path, gpuswarm: Gs) -> None:
    """AKA's flow with `cp -r` (new mtimes): 'ships' has a validation_report.yaml in its task
    folder and writes none; 'rewrites' ships one too and writes another; 'writes' ships none.
    Only 'ships' is not done, on both attempts (attempt 2 copies the file back after its
    set-aside), and the reason says it is a copy from the source folder."""
    for name in ("ships", "rewrites", "writes"):
        folder = tmp_path / "tasks" / name / "sub"
        folder.mkdir(parents=True)
        (folder.parent / "config.yaml").write_text("kind: test\n")
    for name in ("ships", "rewrites"):
        (tmp_path / "tasks" / name / "sub" / "validation_report.yaml").write_text("passed: true\n")
    report = "{workspace}/sub/validation_report.yaml"
    cmd = (
        "cp -r {task_dir}/. {workspace}/ && "
        f"if [ {{task_rel}} != ships ]; then echo 'passed: false' > {report}; fi"
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "copied",
            "gpus": "sim:2",
            "tasks_root": "tasks",
            "reliability": {"retry_backoff": None},
            "defaults": {"done_when": "sub/validation_report.yaml", "max_attempts": 2},
            "tasks": [{"glob": "tasks/*/config.yaml", "command": cmd, "shell": True}],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    assert task_states(run) == {"ships": "failed", "rewrites": "done", "writes": "done"}
    attempts = descriptor(run, "ships")["attempts"]
    assert len(attempts) == 2, attempts
    for attempt in attempts:  # attempt 2's copy came back after the set-aside: refused again
        assert "not written by this attempt" in attempt["reason"], attempt
        assert "byte-identical" in attempt["reason"] and "source folder" in attempt["reason"]
    (failure,) = summary_of(run)["failures"]
    assert "byte-identical" in failure["reason"], failure
    stale = run / "tasks" / "ships" / "stale" / "attempt-2-validation_report.yaml"
    assert stale.read_text() == "passed: true\n"  # attempt 1's copy set aside, never deleted
    assert gpuswarm("check", run).returncode == 0


def test_a_task_running_in_its_workspace_is_not_its_own_source(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    """`cwd: {workspace}`: the completion file the task writes there is not compared with
    itself (a task whose source folder is its workspace is done as before)."""
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "inplace",
            "gpus": "sim:1",
            "tasks": [
                {
                    "name": "t",
                    "command": "echo 'ok: 1' > r.yaml",
                    "shell": True,
                    "cwd": "{workspace}",
                    "done_when": "r.yaml",
                }
            ],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 0, res
    assert task_states(only_run(tmp_path / "runs")) == {"t": "done"}


def test_a_copied_completion_file_is_not_judged_done_on_resume(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    """The orphan path: the task copies its folder (new times) after its supervisor was
    SIGKILLed and exits 0; resume does not judge it done by the copy: it runs it again."""
    folder = tmp_path / "tasks" / "ships"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("kind: test\n")
    (folder / "r.yaml").write_text("passed: true\n")
    go = tmp_path / "go"
    cmd = f"while [ ! -e {go} ]; do sleep 0.05; done; cp -r {{task_dir}}/. {{workspace}}/"
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "orphan-copy",
            "gpus": "sim:1",
            "tasks_root": "tasks",
            "defaults": {"done_when": "r.yaml"},
            "tasks": [{"glob": "tasks/*/config.yaml", "command": cmd, "shell": True}],
        },
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: any(e["ev"] == "started" for e in read_events(run)), 30)
    proc.send(signal.SIGKILL)
    proc.wait(30)
    go.touch()
    wait_for(lambda: (run / "tasks" / "ships" / "r.yaml").exists(), 30)
    wait_for(lambda: not env_processes("GPUSWARM_RUN_DIR", str(run)), 30, what="orphan exits")
    res = gpuswarm("resume", run, "--plain")
    assert res.returncode == 1, res  # re-run: the copy again, now judged by the committer
    attempts = descriptor(run, "ships")["attempts"]
    assert [a["kind"] for a in attempts] == ["lost", "exited"], attempts
    assert "byte-identical" in attempts[-1]["reason"], attempts
    assert gpuswarm("check", run).returncode == 0
