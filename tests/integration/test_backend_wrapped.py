"""The real CLI on the ``wrapped`` backend (no wake-up fd: every attempt in a waiter thread):
a run completes, a timeout kills the attempt's whole tree, a SIGKILLed run resumes; an unknown
backend is a config error."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_driver import CliProcess, CliResult, count_events, pid_running, wait_for, wait_for_run
from integration_support import descriptor, task_states, wait_no_run_processes

pytestmark = pytest.mark.slow

PY = sys.executable
Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]

# A task whose child escapes into its own session, ignores SIGTERM and writes its pid; the task
# itself then sleeps (its timeout ends it).
ESCAPE_PY = r"""
import os, signal, sys, time
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(pidfile + ".tmp", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(pidfile + ".tmp", pidfile)
    time.sleep(300)
    os._exit(0)
while not os.path.exists(pidfile):
    time.sleep(0.01)
time.sleep(300)
"""


def write_config(tmp_path: Path, top: dict[str, Any], tasks: list[dict[str, Any]]) -> Path:
    lines = [f"{k}: {json.dumps(v)}" for k, v in top.items()]  # JSON values are YAML values
    lines.append("tasks:")
    for t in tasks:
        lines += [
            f"  {'- ' if i == 0 else '  '}{k}: {json.dumps(v)}"
            for i, (k, v) in enumerate(t.items())
        ]
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _gone(pid: int, marker: str) -> bool:
    try:
        return not pid_running(pid) or marker not in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return True


def test_wrapped_run_completes_and_a_timeout_kills_the_tree(tmp_path: Path, gpuswarm: Cli) -> None:
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE_PY)
    pidfile = tmp_path / "escapee.pid"
    tasks: list[dict[str, Any]] = [
        {"name": f"ok{i}", "command": [PY, "-c", "print('hi')"]} for i in range(4)
    ]
    tasks.append({"name": "bad", "command": [PY, "-c", "import sys; sys.exit(3)"]})
    tasks.append({"name": "hang", "command": [PY, str(script), str(pidfile)], "timeout": "1s"})
    top = {"name": "wrapped", "workspace": "ws", "gpus": "sim:2", "grace": "0.5s"}
    config = write_config(tmp_path, {**top, "backend": "wrapped"}, tasks)
    res = gpuswarm("run", config, timeout=60)
    assert res.returncode == 1, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    states = task_states(run_dir)
    assert states == {**{f"ok{i}": "done" for i in range(4)}, "bad": "failed", "hang": "failed"}
    hang = descriptor(run_dir, "hang")
    assert hang["attempts"][-1]["kind"] == "timeout", hang
    pid = int(pidfile.read_text())
    wait_for(lambda: _gone(pid, str(script)), 10, what=f"escapee {pid} to die")
    wait_no_run_processes(run_dir, timeout=10)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["config"]["backend"] == "wrapped"


def test_wrapped_run_resumes_after_a_sigkill(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    n = 12
    tasks = [
        {"name": f"t{i:02d}", "command": [PY, "-c", "import time; time.sleep(0.3)"]}
        for i in range(n)
    ]
    top = {"name": "wrapped", "workspace": "ws", "gpus": "sim:2", "backend": "wrapped"}
    config = write_config(tmp_path, top, tasks)
    proc = gpuswarm_popen("run", config)
    run_dir = wait_for_run(tmp_path / "ws")
    wait_for(lambda: count_events(run_dir, "finished") >= 3 or not proc.alive(), 30, what="3 tasks")
    proc.send(signal.SIGKILL)
    proc.wait(10)
    res = gpuswarm("resume", run_dir, timeout=60)
    assert res.returncode == 0, str(res)
    assert set(task_states(run_dir).values()) == {"done"}
    wait_no_run_processes(run_dir, timeout=10)


def test_unknown_backend_is_a_config_error(tmp_path: Path, gpuswarm: Cli) -> None:
    top = {"name": "nope", "workspace": "ws", "gpus": "sim:1", "backend": "docker"}
    config = write_config(tmp_path, top, [{"name": "a", "command": [PY, "-c", "pass"]}])
    res = gpuswarm("run", config, timeout=60)
    assert res.returncode == 2, str(res)
    assert "backend" in res.stderr and "docker" in res.stderr, res.stderr
    assert not (tmp_path / "ws").exists() or not list((tmp_path / "ws").rglob("run.json"))
