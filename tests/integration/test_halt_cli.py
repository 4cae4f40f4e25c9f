"""Issue 28 through the real CLI: ``--halt`` / ``halt:`` (GNU parallel's meanings), and what a
run says when it ends: stopped by Ctrl-C or a halt (one block), finished with failures, the
``[done/total]`` lines that follow the queue, and attempts numbered one way after a resume."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run
from integration_support import read_results

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]
PY = sys.executable


def _lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _yaml(path: Path, tasks: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(json.dumps({**top, "tasks": tasks}))  # JSON is YAML
    return path


def _started(run: Path) -> list[str]:
    return [str(e["task"]) for e in read_events(run) if e.get("ev") == "started"]


def _summary(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return data


def test_soon_fail_n_stops_claiming_and_resume_goes_on(tmp_path: Path, gpuswarm: Cli) -> None:
    fails = _lines(tmp_path / "fails.txt", [f"false {i}" for i in range(20)])
    ws = tmp_path / "ws"
    result = gpuswarm("run", fails, "--gpus", "sim:2", "--plain", "--workspace", ws, "--halt",
                      "soon,fail=3")  # fmt: skip
    assert result.returncode == 1, result
    run = wait_for_run(ws)
    started = _started(run)
    assert 3 <= len(started) <= 3 + 2, started  # at most N + slots attempts
    summary = _summary(run)
    assert summary["stopped_by"] == "halt: 3 tasks failed (halt soon,fail=3)"
    assert summary["counts"]["pending"] == 20 - len(started)
    assert f"stopped by halt: 3 tasks failed (halt soon,fail=3): {20 - len(started)} pending; " \
        f"finish with: gpuswarm resume {run}" in result.stderr  # fmt: skip
    assert "halt: 3 tasks failed (halt soon,fail=3): no new tasks" in result.stderr  # its line
    assert "pending cmd-" not in result.stderr  # no line per left task
    status = gpuswarm("status", run)
    assert "stopped by halt: 3 tasks failed" in status.stdout, status
    assert "consistent" in gpuswarm("check", run).stdout

    # the run keeps its halt: a resume halts again after 3 more (it counts anew) ...
    again = gpuswarm("resume", run, "--plain", "--gpus", "sim:2")
    assert again.returncode == 1 and "stopped by halt: 3 tasks failed" in again.stderr, again
    assert len(_started(run)) <= len(started) + 3 + 2
    # ... and --halt never finishes it
    rest = gpuswarm("resume", run, "--plain", "--gpus", "sim:2", "--halt", "never")
    assert rest.returncode == 1, rest
    assert _summary(run)["counts"]["failed"] == 20 and "stopped_by" not in _summary(run)
    assert f"finished with failures: 20 failed (see the reasons above); run them again with: " \
        f"gpuswarm resume {run}" in rest.stderr  # fmt: skip
    assert "unfinished" not in rest.stderr


def test_now_fail_1_from_the_config_stops_running_tasks(tmp_path: Path, gpuswarm: Cli) -> None:
    tasks = [{"name": "bad", "command": [PY, "-c", "import time; time.sleep(0.5); exit(1)"]}]
    tasks += [{"name": f"slow{i}", "command": ["sleep", "60"]} for i in range(5)]
    config = _yaml(tmp_path / "c.yaml", tasks, halt="now,fail=1")
    t0 = time.monotonic()
    result = gpuswarm("run", config, "--gpus", "sim:3", "--plain", "--workspace", tmp_path / "ws")
    assert result.returncode == 1, result
    assert time.monotonic() - t0 < 30  # the sleepers were stopped, not waited for
    run = wait_for_run(tmp_path / "ws")
    rows = read_results(run)
    assert rows["bad"]["state"] == "failed"
    assert {rows[f"slow{i}"]["state"] for i in range(5)} == {"pending"}
    assert {rows[f"slow{i}"]["attempts"] for i in range(5)} == {"0"}  # never counted
    assert (
        "stopped by halt: 1 task failed (halt now,fail=1): 2 running tasks put back in the "
        "queue, 3 pending; finish with: gpuswarm resume"
    ) in result.stderr
    assert "cancelled" not in result.stderr
    assert "consistent" in gpuswarm("check", run).stdout


def test_now_success_1_ends_at_the_first_done_task_with_exit_0(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    lines = ["true"] + ["sleep 60"] * 5
    result = gpuswarm("run", _lines(tmp_path / "l.txt", lines), "--gpus", "sim:2", "--plain",
                      "--workspace", tmp_path / "ws", "--halt", "now,success=1")  # fmt: skip
    assert result.returncode == 0, result
    run = wait_for_run(tmp_path / "ws")
    assert _summary(run)["counts"]["done"] == 1 and _summary(run)["counts"]["pending"] == 5


def test_skipped_tasks_never_count(tmp_path: Path, gpuswarm: Cli) -> None:
    skip = {"command": [PY, "-c", "exit(3)"], "skip_exit_code": 3}
    tasks = [{"name": f"s{i}", **skip} for i in range(3)]
    tasks += [{"name": f"ok{i}", "command": "true"} for i in range(2)]
    config = _yaml(tmp_path / "c.yaml", tasks, halt="soon,done=1")
    result = gpuswarm("run", config, "--gpus", "sim:1", "--plain", "--workspace", tmp_path / "ws")
    assert result.returncode == 0, result
    counts = _summary(wait_for_run(tmp_path / "ws"))["counts"]
    assert (counts["skipped"], counts["done"], counts["pending"]) == (3, 1, 1)


def test_a_bad_spec_is_exit_2_naming_the_flag_or_the_field(tmp_path: Path, gpuswarm: Cli) -> None:
    lines = _lines(tmp_path / "l.txt", ["true"])
    flag = gpuswarm("run", lines, "--gpus", "sim:1", "--halt", "soon,fail=0")
    assert flag.returncode == 2 and "'--halt'" in flag.stderr and "now,fail=1" in flag.stderr
    config = _yaml(tmp_path / "c.yaml", [{"command": "true"}], halt="sometimes")
    field = gpuswarm("run", config, "--gpus", "sim:1")
    assert field.returncode == 2, field
    assert "c.yaml" in field.stderr and "halt" in field.stderr and "soon,fail=3" in field.stderr
    assert not (tmp_path / "runs").exists()  # nothing half-made


def test_ctrl_c_ends_with_one_block(tmp_path: Path, gpuswarm_popen: Popen) -> None:
    lines = _lines(tmp_path / "l.txt", ["sleep 60"] * 6)
    proc = gpuswarm_popen(
        "run", lines, "--gpus", "sim:2", "--plain", "--workspace", tmp_path / "ws"
    )
    run = wait_for_run(tmp_path / "ws")
    wait_for(lambda: len(_started(run)) == 2, what="two tasks started")
    proc.send(signal.SIGINT)
    result = proc.wait()
    assert result.returncode == 130, result
    assert (
        "stopped by Ctrl-C (SIGINT): 2 running tasks put back in the queue, 4 pending; "
        f"finish with: gpuswarm resume {run}"
    ) in result.stderr
    assert "cancelled" not in result.stderr and "pending cmd-" not in result.stderr
    assert "SIGTERM" not in result.stderr.split("pending 6")[-1]  # the summary names SIGINT
    reason = read_results(run)["cmd-00001"]["reason"]
    assert reason.startswith("interrupted by Ctrl-C (SIGINT)") and "cancelled" not in reason


def test_sigterm_is_named_as_such(tmp_path: Path, gpuswarm_popen: Popen) -> None:
    lines = _lines(tmp_path / "l.txt", ["sleep 60"] * 2)
    proc = gpuswarm_popen(
        "run", lines, "--gpus", "sim:1", "--plain", "--workspace", tmp_path / "ws"
    )
    run = wait_for_run(tmp_path / "ws")
    wait_for(lambda: _started(run), what="a task started")
    proc.send(signal.SIGTERM)
    result = proc.wait()
    assert "stopped by SIGTERM: 1 running task put back in the queue, 1 pending" in result.stderr


def test_a_run_whose_tasks_all_ran_is_finished_with_failures(tmp_path: Path, gpuswarm: Cli) -> None:
    lines = _lines(tmp_path / "l.txt", ["no-such-program-gs28 --x", "true"])
    result = gpuswarm("run", lines, "--gpus", "sim:1", "--plain", "--workspace", tmp_path / "ws")
    assert result.returncode == 1, result
    assert "finished with failures: 1 failed" in result.stderr
    assert "unfinished" not in result.stderr


def _blocker(tmp_path: Path) -> str:
    script = tmp_path / "blocker.py"
    go = tmp_path / "go"
    script.write_text(
        f"import os, time\nwhile not os.path.exists({str(go)!r}):\n time.sleep(0.05)\n"
    )
    return f"{PY} {script}"


def test_the_plain_progress_total_follows_tasks_added_to_a_live_run(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    config = _yaml(tmp_path / "c.yaml", [{"name": "blocker", "command": _blocker(tmp_path)}])
    proc = gpuswarm_popen("run", config, "--gpus", "sim:1", "--plain", "--workspace",
                          tmp_path / "ws")  # fmt: skip
    run = wait_for_run(tmp_path / "ws")
    wait_for(lambda: _started(run), what="the blocker started")
    added = gpuswarm("add", run, "-", input="true\ntrue\n")
    assert added.returncode == 0, added
    (tmp_path / "go").touch()
    result = proc.wait()
    assert result.returncode == 0, result
    dones = [line for line in result.stderr.splitlines() if " done " in line and "[" in line]
    assert [line.rsplit("[", 1)[1] for line in dones] == [
        "1/3 done]",
        "2/3 done]",
        "3/3 done]",
    ], result.stderr


def test_attempts_are_numbered_one_way_after_a_resume(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    task = {"name": "t", "command": [PY, "-c", "import time; time.sleep(1); exit(1)"]}
    config = _yaml(tmp_path / "c.yaml", [{**task, "max_attempts": 2}],
                   reliability={"retry_backoff": 0.1})  # fmt: skip
    proc = gpuswarm_popen(
        "run", config, "--gpus", "sim:1", "--plain", "--workspace", tmp_path / "ws"
    )
    run = wait_for_run(tmp_path / "ws")
    wait_for(lambda: _started(run), what="attempt 1 started")
    proc.send(signal.SIGINT)
    assert proc.wait().returncode == 130
    result = gpuswarm("resume", run, "--plain", "--gpus", "sim:1")
    assert result.returncode == 1, result
    # attempt 1 was interrupted: the resume's attempts are 2 and 3, the budget's 1/2 and 2/2
    assert "start  t attempt 2" in result.stderr and "start  t attempt 3" in result.stderr
    assert "(attempt 2, 1/2 of max_attempts used, again in 0.1s)" in result.stderr, result
    assert read_results(run)["t"]["attempts"] == "2"
    status = gpuswarm("status", run)
    assert "failed t: exit 1 (2 attempts + 1 interrupted)" in status.stdout, status
