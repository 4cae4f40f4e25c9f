"""The docker backend leaves nothing behind: timeouts, and a supervisor SIGKILLed mid-run.

Real containers (``dockerkit``'s offline image); marked ``docker`` (see ``tests/conftest.py``:
skipped without an engine, failed then in CI; no container of the test's runs may be left).
"""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run
from dockerkit import USR_MOUNT, containers
from integration_support import descriptor, task_states

pytestmark = [pytest.mark.slow, pytest.mark.docker]

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]


def write_config(folder: Path, config: dict[str, Any]) -> Path:
    path = folder / "config.yaml"
    path.write_text(json.dumps(config, indent=1) + "\n")  # JSON is YAML
    return path


def docker_block(image: str) -> dict[str, Any]:
    return {"image": image, "network": "none", "mounts": [USR_MOUNT]}


def processes_with_arg(arg: str) -> list[psutil.Process]:
    """Live processes of this host (containers' included) with ``arg`` in their argv."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and arg in (proc.info["cmdline"] or []):
            out.append(proc)
    return out


# -- 1. a timeout ends a TERM-ignoring tree and its setsid escapee, and the container --------------
def test_a_timeout_kills_a_term_ignoring_tree_with_a_setsid_escapee(
    tmp_path: Path, gpuswarm: Cli, docker_image: str
) -> None:
    # a sleep no other test runs, so that its survivors can be found among the host's processes
    token = f"{random.randrange(10**6, 10**7)}.5"
    task = (
        "trap '' TERM; "
        f"setsid sh -c 'trap \"\" TERM; echo $$ > {{workspace}}/escapee.pid; exec sleep {token}' & "
        f"exec sleep {token}"
    )
    config = write_config(
        tmp_path,
        {
            "name": "hang",
            "workspace": "ws",
            "gpus": "sim:1",
            "grace": "0.5s",
            "backend": "docker",
            "docker": docker_block(docker_image),
            "tasks": [{"name": "hang", "shell": True, "command": task, "timeout": "2s"}],
        },
    )
    res = gpuswarm("run", "-q", "--no-report", config)
    assert res.returncode == 1, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    assert task_states(run_dir) == {"hang": "failed"}
    desc = descriptor(run_dir, "hang")
    assert desc["reason"].startswith("timeout"), desc["reason"]
    assert desc["attempts"][-1]["kind"] == "timeout", desc["attempts"]
    # the escapee was there (it wrote its pid), and nothing of the tree survived the timeout
    assert (run_dir / "tasks" / "hang" / "escapee.pid").read_text().strip()
    assert processes_with_arg(token) == []
    assert containers(run=run_dir) == []


# -- 2. SIGKILL of the supervisor, then resume -----------------------------------------------------
def test_resume_after_a_sigkilled_supervisor_removes_its_containers_first(
    tmp_path: Path, gpuswarm_popen: Popen, docker_image: str
) -> None:
    ids = [f"s{i}" for i in range(4)]
    task = "echo $GPUSWARM_ATTEMPT > {workspace}/began.$GPUSWARM_ATTEMPT; sleep 2"
    config = write_config(
        tmp_path,
        {
            "name": "crash",
            "workspace": "ws",
            "gpus": "sim:2",
            "grace": "0.5s",
            "backend": "docker",
            "docker": docker_block(docker_image),
            "tasks": [{"name": i, "shell": True, "command": task, "max_attempts": 3} for i in ids],
        },
    )
    run = gpuswarm_popen("run", "--plain", "--no-report", config)
    run_dir = wait_for_run(tmp_path / "ws")

    def two_tasks_inside() -> list[Any]:
        began = list((run_dir / "tasks").glob("*/began.*"))
        live = [c for c in containers(run=run_dir) if c.state == "running"]
        return live if len(began) >= 2 and len(live) >= 2 else []

    live = wait_for(two_tasks_inside, 30, 0.1, what="two tasks running in containers")
    (owner,) = {c.labels["owner"] for c in live}
    run.send(signal.SIGKILL)
    run.wait(10)
    # killing the supervisor (and so the docker clients' parent) does not end the containers:
    # they are what resume must find and remove
    left = containers(run=run_dir, owner=owner)
    assert left, "the dead owner's containers were already gone: nothing left to recover"

    resume = gpuswarm_popen("resume", run_dir, "--plain", "--no-report")

    def new_attempt_started() -> bool:
        events = read_events(run_dir)
        starts = [i for i, e in enumerate(events) if e["ev"] == "supervisor_started"]
        return len(starts) >= 2 and any(e["ev"] == "started" for e in events[starts[1] :])

    wait_for(new_attempt_started, 30, 0.05, what="resume to start an attempt")
    # before anything was requeued and started again, the dead owner's containers were removed
    assert containers(run=run_dir, owner=owner) == [], containers(run=run_dir, owner=owner)
    res = resume.wait(90)
    assert res.returncode == 0, str(res)
    assert task_states(run_dir) == dict.fromkeys(ids, "done")
    assert containers(run=run_dir) == []
    # nor the dead supervisor's docker clients (attached to containers that are gone)
    wait_for(lambda: not processes_with_arg(f"gpuswarm.run={run_dir}"), 10, 0.1, what="clients")


# -- 3. a stop (SIGTERM) ends the containers; resume finishes ------------------------------------
def test_a_stop_ends_every_container_and_resume_finishes(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen, docker_image: str
) -> None:
    token = f"{random.randrange(10**6, 10**7)}.5"
    config = write_config(
        tmp_path,
        {
            "name": "stop",
            "workspace": "ws",
            "gpus": "sim:2",
            "grace": "1s",
            "backend": "docker",
            "docker": docker_block(docker_image),
            "tasks": [
                {
                    "name": f"s{i}",
                    "shell": True,
                    "command": f"test -f {{workspace}}/again || {{ touch {{workspace}}/again; "
                    f"exec sleep {token}; }}",
                }
                for i in range(2)
            ],
        },
    )
    run = gpuswarm_popen("run", "--plain", "--no-report", config)
    run_dir = wait_for_run(tmp_path / "ws")
    wait_for(lambda: len(processes_with_arg(token)) == 2, 30, 0.1, what="two tasks asleep inside")
    run.send(signal.SIGTERM)
    assert run.wait(30).returncode == 130, run.stderr()
    assert containers(run=run_dir) == []
    assert processes_with_arg(token) == []
    assert set(task_states(run_dir).values()) == {"pending"}
    res = gpuswarm("resume", run_dir, "-q", "--no-report")
    assert res.returncode == 0, str(res)
    assert task_states(run_dir) == {"s0": "done", "s1": "done"}


# -- 4. check sees a dead owner's containers; --repair removes them -------------------------------
def test_check_reports_a_dead_owners_containers_and_repair_removes_them(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen, docker_image: str
) -> None:
    config = write_config(
        tmp_path,
        {
            "name": "chk",
            "workspace": "ws",
            "gpus": "sim:1",
            "backend": "docker",
            "docker": docker_block(docker_image),
            "tasks": [{"name": "c", "shell": True, "command": "touch {workspace}/in; sleep 60"}],
        },
    )
    run = gpuswarm_popen("run", "--plain", "--no-report", config)
    run_dir = wait_for_run(tmp_path / "ws")
    wait_for(lambda: (run_dir / "tasks" / "c" / "in").exists(), 30, 0.1, what="the task inside")
    run.send(signal.SIGKILL)
    run.wait(10)
    (left,) = containers(run=run_dir)
    res = gpuswarm("check", run_dir)
    assert res.returncode == 1, str(res)
    assert left.name in res.stdout, str(res)
    assert containers(run=run_dir) == [left]  # check alone changes nothing
    res = gpuswarm("check", "--repair", run_dir)
    assert res.returncode == 0, str(res)
    assert containers(run=run_dir) == []
    assert task_states(run_dir) == {"c": "pending"}


# -- 5. a supervisor that joins the run reclaims a dead owner's task: its container goes first ---
def test_work_reclaims_a_dead_owners_task_after_removing_its_container(
    tmp_path: Path, gpuswarm_popen: Popen, docker_image: str
) -> None:
    config = write_config(
        tmp_path,
        {
            "name": "recl",
            "workspace": "ws",
            "gpus": "sim:1",
            "backend": "docker",
            "docker": docker_block(docker_image),
            "tasks": [
                {
                    "name": "a",
                    "shell": True,
                    "command": "touch {workspace}/in.$GPUSWARM_ATTEMPT; sleep 2",
                    "max_attempts": 3,
                }
            ],
        },
    )
    run = gpuswarm_popen("run", "--plain", "--no-report", config)
    run_dir = wait_for_run(tmp_path / "ws")
    ws = run_dir / "tasks" / "a"
    wait_for(lambda: (ws / "in.1").exists(), 30, 0.1, what="attempt 1 inside")
    (old,) = containers(run=run_dir)
    run.send(signal.SIGKILL)
    run.wait(10)
    work = gpuswarm_popen("work", run_dir, "--gpus", "sim:1", "--plain", "--no-report")
    wait_for(
        lambda: any(e["ev"] == "started" and e["attempt"] == 2 for e in read_events(run_dir)),
        30,
        0.05,
        what="attempt 2 to start",
    )
    assert containers(run=run_dir, owner=old.labels["owner"]) == []
    res = work.wait(60)
    assert res.returncode == 0, str(res)
    assert task_states(run_dir) == {"a": "done"}
    assert containers(run=run_dir) == []
