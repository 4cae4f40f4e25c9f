"""A stop from outside (supervise/outside_stop.py) through the real CLI: whoever stops a whole
job at once (Slurm's scancel, a container stop) signals the task and ``gpuswarm run`` together,
and the task may die first. Here the order is forced: SIGTERM to the task's process group, its
death seen by the supervisor, then SIGTERM to the supervisor. The task was interrupted by the
stop (back in the queue, no attempt used), not failed; a SIGKILL is a failure even then, and a
task that kills itself with SIGTERM, no stop following, still fails."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run
from integration_support import read_results

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]

TASK = """\
import os, signal, sys, time
if sys.argv[1] == "self":
    os.kill(os.getpid(), signal.SIGTERM)  # dies of its own SIGTERM (no handler)
tmp = sys.argv[1] + ".tmp"
with open(tmp, "w") as f:
    f.write(str(os.getpid()))  # its own process group's (its attempt's main process)
os.replace(tmp, sys.argv[1])
time.sleep(60)
"""


def _lines(tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "task.py"
    script.write_text(TASK)
    path = tmp_path / "l.txt"
    path.write_text("".join(f"{sys.executable} {script} {a}\n" for a in args))
    return path


def _gone(pid: int) -> bool:
    """Reaped by its supervisor (a zombie still answers signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _killed_then_stopped(tmp_path: Path, gpuswarm_popen: Popen, sig: int) -> tuple[Path, str]:
    """Two tasks run; ``sig`` to the first one's process group, its death seen by the
    supervisor, then SIGTERM to the supervisor: the run folder and its stderr."""
    first, second = tmp_path / "first.pid", tmp_path / "second.pid"
    lines = _lines(tmp_path, str(first), str(second))
    ws = tmp_path / "ws"
    proc = gpuswarm_popen(
        "run", lines, "--no-shell", "--gpus", "sim:2", "--plain", "--workspace", ws
    )
    run = wait_for_run(ws)
    wait_for(lambda: first.exists() and second.exists(), what="both tasks running")
    group = int(first.read_text())  # --no-shell: the task's process is the attempt's main
    os.killpg(group, sig)  # the task's process group first, all of it at once
    wait_for(lambda: _gone(group), what="the attempt's main process reaped by its supervisor")
    time.sleep(0.2)  # without the hold, its failure is settled by now; the hold lasts 1 s
    proc.send(signal.SIGTERM)  # then its supervisor's stop
    result = proc.wait()
    assert result.returncode == 130, result
    return run, result.stderr


@pytest.mark.timeout(60)
def test_task_killed_from_outside_then_its_supervisor_is_interrupted(
    tmp_path: Path, gpuswarm_popen: Popen
) -> None:
    run, stderr = _killed_then_stopped(tmp_path, gpuswarm_popen, signal.SIGTERM)
    assert "stopped by SIGTERM: 2 running tasks put back in the queue" in stderr, stderr
    rows = read_results(run)
    assert rows["cmd-00001"]["state"] == "pending", rows
    reason = rows["cmd-00001"]["reason"]
    assert reason.startswith("interrupted by SIGTERM (SIGTERM from outside"), reason
    events = read_events(run)
    assert not [e for e in events if e.get("ev") == "finished"], events  # nothing judged failed
    requeued = {e["task"] for e in events if e.get("ev") == "requeued"}
    assert requeued == {"cmd-00001", "cmd-00002"}, events
    (desc,) = run.glob(".parallel/pending/*_cmd-00001.json")
    attempts = json.loads(desc.read_text())["attempts"]
    assert [a["interrupted"] for a in attempts] == [True], attempts  # no attempt used


@pytest.mark.timeout(60)
def test_sigkill_from_outside_is_a_failure_even_with_the_stop(
    tmp_path: Path, gpuswarm_popen: Popen
) -> None:
    """Only a stop's signals (TERM, INT, HUP) wait for the stop: a SIGKILL (the OOM killer's)
    is the task's failure at once."""
    run, stderr = _killed_then_stopped(tmp_path, gpuswarm_popen, signal.SIGKILL)
    assert "stopped by SIGTERM: 1 running task put back in the queue" in stderr, stderr
    rows = read_results(run)
    assert (rows["cmd-00001"]["state"], rows["cmd-00001"]["reason"]) == (
        "failed",
        "killed by SIGKILL",
    ), rows
    assert rows["cmd-00002"]["state"] == "pending", rows


@pytest.mark.timeout(60)
def test_task_that_kills_itself_with_sigterm_still_fails(tmp_path: Path, gpuswarm: Cli) -> None:
    result = gpuswarm("run", _lines(tmp_path, "self"), "--no-shell", "--gpus", "sim:1",
                      "--plain", "--workspace", tmp_path / "ws")  # fmt: skip
    assert result.returncode == 1, result
    row = read_results(wait_for_run(tmp_path / "ws"))["cmd-00001"]
    assert (row["state"], row["reason"]) == ("failed", "killed by SIGTERM"), row
