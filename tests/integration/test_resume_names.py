"""Which run `resume` takes, and the priority of tasks added to a live run (issue 11).

- `resume run_20260702_041903` (a bare run name, as AgentKernelArena takes it) or a path inside
  a run (`.../run.json`, a task's log) gave "no such run directory";
- `--latest` without `--name` takes the newest run of any name: it now says which one;
- a task added to a live run with a higher priority was claimed after every task already in the
  supervisor's in-memory heap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_driver import find_runs, read_events, run_cli, start_cli, wait_for, wait_for_run

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.queue import DirQueue

pytestmark = pytest.mark.slow  # CLI processes: part of CI, not of the fast suite


def _config(folder: Path, name: str, command: str = "true") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nworkspace: runs\ngpus: sim:1\n"
        f"tasks:\n  - {{name: a, command: '{command}', shell: true}}\n"
    )
    return path


def test_resume_takes_a_bare_run_name_or_a_path_inside_the_run(tmp_path: Path) -> None:
    flag = tmp_path / "fixed"
    cmd = f"test -e {flag}"
    assert (
        run_cli("run", "-q", "--no-report", _config(tmp_path, "aka", cmd), cwd=tmp_path).returncode
        == 1
    )
    (run_dir,) = find_runs(tmp_path / "runs")
    flag.touch()
    res = run_cli("resume", "-q", "--no-report", run_dir.name, cwd=tmp_path)
    assert res.returncode == 0, res  # was: "run_...: no such run directory"
    for inner in (run_dir / "run.json", run_dir / "tasks" / "a" / "attempt-1" / "output.log"):
        res = run_cli("resume", "-q", "--no-report", inner, cwd=tmp_path)
        assert res.returncode == 0, res
        res = run_cli("status", inner, "--json", cwd=tmp_path)
        assert res.returncode == 0 and json.loads(res.stdout)["run"] == str(run_dir), res
    res = run_cli("resume", "-q", "run_19990101_000000", cwd=tmp_path)
    assert res.returncode == 2 and "no run of that name under runs" in res.stderr, res
    other = tmp_path / "elsewhere"
    other.mkdir()
    res = run_cli("resume", "-q", "--workspace", tmp_path / "runs", run_dir.name, cwd=other)
    assert res.returncode == 0, res


def test_resume_latest_without_name_takes_the_newest_run_of_any_name_and_says_so(
    tmp_path: Path,
) -> None:
    assert (
        run_cli("run", "-q", "--no-report", _config(tmp_path, "first"), cwd=tmp_path).returncode
        == 0
    )
    time.sleep(1.1)  # run folders are named by the second
    assert (
        run_cli("run", "-q", "--no-report", _config(tmp_path, "second"), cwd=tmp_path).returncode
        == 0
    )
    first, second = find_runs(tmp_path / "runs")  # <workspace>/<name>/run_*: first, second
    res = run_cli("resume", "--no-report", "--latest", cwd=tmp_path)
    assert res.returncode == 0, res
    assert f"resuming {second}, the newest of the runs of any name (--name to choose)" in res.stderr
    res = run_cli("resume", "--no-report", "--latest", "--name", "first", cwd=tmp_path)
    assert (
        res.returncode == 0
        and f"resuming {first}, the newest of the runs named 'first'" in res.stderr
    ), res


def test_a_task_added_to_a_live_run_with_a_higher_priority_is_claimed_next(tmp_path: Path) -> None:
    config = tmp_path / "prio.yaml"
    lines = ["name: prio", "workspace: runs", "gpus: sim:1", "tasks:"]
    lines += [f"  - {{name: low{i}, command: 'sleep 0.4', shell: true}}" for i in range(6)]
    config.write_text("\n".join(lines) + "\n")
    proc = start_cli("run", "-q", "--no-report", config, cwd=tmp_path, log_dir=tmp_path / "_l")
    try:
        run_dir = wait_for_run(tmp_path / "runs")
        wait_for(lambda: any(e["ev"] == "started" for e in read_events(run_dir)), 20)
        task = TaskSpec(id="urgent", name="urgent", command="true", shell=True, priority=9)
        DirQueue.add_pending(RunPaths(run_dir), task.model_dump(), 1000)
        assert proc.wait(60).returncode == 0, proc.stderr()
    finally:
        proc.kill_group()
    order = [e["task"] for e in read_events(run_dir) if e["ev"] == "started"]
    assert order[0] == "low0" and order.index("urgent") <= 2, order  # was: last, after low5
    assert sorted(order) == sorted(["urgent", *(f"low{i}" for i in range(6))])
    assert (run_dir / ".parallel" / "added").exists()
