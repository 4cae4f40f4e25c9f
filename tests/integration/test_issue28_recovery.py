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


def test_a_task_copying_its_cwd_is_not_done(tmp_path: Path, gpuswarm: Gs) -> None:
    """A task no glob matched: its source folder is its `cwd`."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "r.yaml").write_text("ok: 1\n")
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "cwdcopy",
            "gpus": "sim:1",
            "tasks": [
                {
                    "name": "t",
                    "command": "cp -r . {workspace}/",
                    "shell": True,
                    "cwd": str(src),
                    "done_when": "r.yaml",
                }
            ],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    assert task_states(run) == {"t": "failed"}
    assert "byte-identical" in descriptor(run, "t")["attempts"][0]["reason"]


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


# -- item 6: output printed while no supervisor reads reaches the log and the metrics ------------
def _late_printer(tmp_path: Path, name: str, gpus: str) -> tuple[Path, Path]:
    """A config whose one task waits for a go file, then prints its metric, writes its result
    and exits: everything it prints comes after its supervisor is SIGKILLed."""
    go = tmp_path / "go"
    cmd = (
        f"echo started; while [ ! -e {go} ]; do sleep 0.05; done; "
        "echo 'speedup: 1.5'; echo 'ok: true' > {workspace}/r.yaml"
    )
    task = {"name": "late", "command": cmd, "shell": True, "done_when": "r.yaml"}
    task["metrics"] = {"speedup": r"^speedup:\s*([0-9.]+)"}
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": name,
            "gpus": gpus,
            "reliability": {"lease_ttl": "2s"},
            "tasks": [task],
        },
    )
    return config, go


def _assert_metric_reached_outputs(run: Path) -> None:
    attempts = descriptor(run, "late")["attempts"]
    assert attempts[-1]["kind"] == "orphan", attempts  # judged done, not re-run
    assert attempts[-1].get("metrics") == {"speedup": 1.5}, attempts
    log = (run / "tasks" / "late" / "attempt-1" / "output.log").read_text()
    assert "started\n" in log and "speedup: 1.5\n" in log, log
    tsv = (run / "results.tsv").read_text().splitlines()
    header, row = tsv[0].split("\t"), tsv[1].split("\t")
    assert row[header.index("speedup")] == "1.5", tsv
    text = (run / "summary.json").read_text()
    assert '"speedup"' in text and "1.5" in text, text


def test_output_printed_after_a_supervisor_sigkill_reaches_the_log_on_resume(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    config, go = _late_printer(tmp_path, "late", "sim:1")
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    log = run / "tasks" / "late" / "attempt-1" / "output.log"
    wait_for(lambda: log.exists() and "started" in log.read_text(), 30, what="the task's start")
    proc.send(signal.SIGKILL)
    proc.wait(30)
    go.touch()  # it prints, writes its result and exits: no supervisor reads its pipe
    wait_for(lambda: not env_processes("GPUSWARM_RUN_DIR", str(run)), 30, what="the task ends")
    res = gpuswarm("resume", run, "--plain")
    assert res.returncode == 0, res
    assert task_states(run) == {"late": "done"}
    _assert_metric_reached_outputs(run)
    assert not env_processes("GPUSWARM_LOG_KEEPER_RUN", str(run)), "a keeper outlived resume"
    assert gpuswarm("check", run).returncode == 0


def test_output_printed_after_a_supervisor_sigkill_reaches_the_log_on_reclaim(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    """The same through a `work` sibling that reclaims the dead `run`'s task (lease_ttl 2s)."""
    config, go = _late_printer(tmp_path, "late2", "sim:1")
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    log = run / "tasks" / "late" / "attempt-1" / "output.log"
    wait_for(lambda: log.exists() and "started" in log.read_text(), 30, what="the task's start")
    sibling = gpuswarm_popen("work", run, "--gpus", "sim:1", "--plain")
    owners = run / ".parallel" / "owners"
    wait_for(lambda: len(list(owners.iterdir())) >= 2, 30, what="the sibling joins")
    sibling.send(signal.SIGSTOP)  # it reclaims only once the task has ended (no race)
    proc.send(signal.SIGKILL)
    proc.wait(30)
    go.touch()
    wait_for(lambda: not env_processes("GPUSWARM_RUN_DIR", str(run)), 30, what="the task ends")
    sibling.send(signal.SIGCONT)
    res = sibling.wait(60)
    assert res.returncode == 0, res
    assert task_states(run) == {"late": "done"}
    _assert_metric_reached_outputs(run)
    assert gpuswarm("check", run).returncode == 0
