"""``gpuswarm run`` inside a Slurm allocation, on a real Slurm (issue 36): two compute nodes of
slurmd's own on this machine (tests/helpers/slurm_cluster.py), with fake GPUs as gres (the only
thing simulated). Every run goes through Slurm's own ``salloc``/``sbatch``/``srun``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster
from slurm_support import (
    cut_short,
    done_once,
    events_of,
    hosts_of_done,
    is_done,
    only_run,
    slurm_env,
    summary_of,
    write_cmds,
    write_config,
)

PY = [sys.executable, "-m", "gpuswarm"]


def _salloc(
    slurm: SlurmCluster,
    cwd: Path,
    alloc: list[str],
    gpuswarm: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """``salloc ALLOC srun --overlap -N1 -n1 -w gsn1 gpuswarm ...``: the head on the first node."""
    argv = [
        "salloc", "--gres=gpu:2", *alloc,
        "srun", "--overlap", "-N1", "-n1", "-w", "gsn1", *PY, *gpuswarm,
    ]  # fmt: skip
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env or slurm_env(slurm),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_one_node_batch_in_salloc(slurm: SlurmCluster, tmp_path: Path) -> None:
    write_cmds(tmp_path, 6, 0.3)
    ws = tmp_path / "runs"
    done = _salloc(
        slurm, tmp_path, ["-N1"], ["run", "cmds.txt", "--gpus", "auto", "--plain",
                                   "--workspace", str(ws), "--no-report"],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(ws)
    info = json.loads((run / "run.json").read_text())
    assert info["gpu_ids"] == [0, 1]  # the two GPUs Slurm granted, one slot each
    assert set(hosts_of_done(run).values()) == {"gsn1"}
    done_once(run, 6)


def test_two_nodes_a_worker_per_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    write_cmds(tmp_path, 12, 1.0)
    ws = tmp_path / "runs"
    done = _salloc(
        slurm, tmp_path, ["-N2"], ["run", "cmds.txt", "--gpus", "auto", "--plain",
                                   "--workspace", str(ws), "--no-report"],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(ws)
    hosts = hosts_of_done(run)
    assert set(hosts.values()) == {"gsn1", "gsn2"}, hosts  # a supervisor on each node
    done_once(run, 12)
    started = [e for e in events_of(run) if e.get("ev") == "supervisor_started"]
    assert len(started) == 2
    assert sorted(len(e["slots"]) for e in started) == [2, 2]  # one slot per granted GPU
    assert "gsn2-gpu0" in (run / "slurm" / "worker-gsn2.log").read_text()
    shown = subprocess.run(
        [*PY, "status", str(run)], env=slurm_env(slurm), capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "head on gsn1; workers on gsn2" in shown, shown
    assert "slurm: a worker on each of gsn2" in done.stdout + done.stderr
    # the head's own output shows the other node's slots too: each of gsn2's tasks ends there
    on_gsn2 = [t for t, host in hosts.items() if host == "gsn2"]
    assert on_gsn2, hosts
    for task in on_gsn2:
        line = re.compile(rf"gsn2-gpu\d +done +{re.escape(task)}\b")
        assert line.search(done.stdout + done.stderr), (task, done.stdout + done.stderr)


def test_run_folder_not_shared_is_bad_input(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The workspace on a tmpfs of gsn1's own: gsn2 cannot see it, so nothing starts."""
    write_cmds(tmp_path, 2, 0.1)
    ws = slurm.local / "runs"
    done = _salloc(
        slurm, tmp_path, ["-N2"], ["run", "cmds.txt", "--gpus", "auto", "--plain",
                                   "--workspace", str(ws)],
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{ws}" in done.stderr and "gsn2" in done.stderr, done.stderr
    assert "not on a filesystem every node" in done.stderr


def test_time_limit_then_resume_in_a_new_allocation(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A 1-minute allocation (Slurm counts whole minutes) that stops warm 40 s before its end:
    tasks of a 5 s timeout are claimed only while they fit; the rest waits for the next
    allocation; 0 lost, 0 finished run again."""
    count = 24  # 24 s of work on 2 slots: more than the 20 s the first allocation leaves
    cfg = write_config(tmp_path, count, 2, timeout="5s")
    ws = tmp_path / "runs"
    env = slurm_env(slurm, GPUSWARM_SLURM_STOP_BEFORE="40")
    first = _salloc(
        slurm, tmp_path, ["-N1", "--time=1"],
        ["run", str(cfg), "--gpus", "auto", "--plain", "--workspace", str(ws), "--no-report"],
        env=env,
    )  # fmt: skip
    assert first.returncode == 130, first.stdout + first.stderr
    run = only_run(ws)
    summary = summary_of(run)
    assert 0 < summary["counts"]["done"] < count, summary
    assert "allocation ends" in str(summary.get("stopped_by")), summary
    # the attempts that ran all finished: none was cut by the allocation's end
    ended = [e for e in events_of(run) if e.get("ev") == "requeued" or cut_short(e)]
    assert ended == [], ended
    second = _salloc(
        slurm, tmp_path, ["-N2", "--time=5:00"],
        ["resume", str(run), "--plain", "--no-report"],
        env=env,
    )  # fmt: skip
    assert second.returncode == 0, second.stdout + second.stderr
    done_once(run, count)


def test_end_signal_stops_warm(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``sbatch --signal=B:USR1@N`` with ``exec gpuswarm run``: Slurm's signal (sent now with
    ``scancel --signal=USR1 --batch``) stops the head and the worker warm; resume finishes."""
    count = 16
    cfg = write_config(tmp_path, count, 2)
    ws = tmp_path / "runs"
    script = tmp_path / "job.sh"
    head = " ".join([*PY, "run", str(cfg), "--gpus", "auto", "--plain", "--workspace", str(ws)])
    script.write_text(f"#!/bin/sh\nexec {head}\n")
    env = slurm_env(slurm)
    sub = subprocess.run(
        ["sbatch", "--parsable", "-N2", "--gres=gpu:2", "--signal=B:USR1@60",
         f"--output={tmp_path}/job.out", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while True:  # some tasks done on both nodes, then the signal
        runs = list(ws.glob("*/run_*"))
        if runs and (runs[0] / "events.jsonl").exists():
            done = [e for e in events_of(runs[0]) if is_done(e)]
            if len(done) >= 4:
                break
        assert time.monotonic() < deadline, (tmp_path / "job.out").read_text()
        time.sleep(0.3)
    subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=env, check=True, timeout=30)
    _wait_job_gone(slurm, job, 60)
    run = only_run(ws)
    summary = summary_of(run)
    assert summary["counts"]["done"] < count, summary
    assert "SIGUSR1" in str(summary.get("stopped_by")), summary
    again = _salloc(slurm, tmp_path, ["-N2"], ["resume", str(run), "--plain", "--no-report"])
    assert again.returncode == 0, again.stdout + again.stderr
    done_once(run, count)


def _wait_job_gone(slurm: SlurmCluster, job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"],
            env=slurm.client_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
        if out in ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT"):
            return
        assert time.monotonic() < deadline, f"job {job} still {out}"
        time.sleep(0.3)


@pytest.mark.timeout(180)
def test_compute_node_killed(slurm: SlurmCluster, tmp_path: Path) -> None:
    """gsn2 dies outright (its slurmd and every process on it): the head takes its tasks back
    through the leases (``lease_ttl`` 3 s) and finishes them; the allocation survives
    (``--no-kill``)."""
    count = 8
    cfg = write_config(tmp_path, count, 3)
    ws = tmp_path / "runs"
    argv = [
        "salloc", "--gres=gpu:2", "-N2", "--no-kill",
        "srun", "--overlap", "-N1", "-n1", "-w", "gsn1",
        *PY, "run", str(cfg), "--gpus", "auto", "--plain", "--workspace", str(ws), "--no-report",
    ]  # fmt: skip
    with (tmp_path / "head.out").open("w") as out:
        head = subprocess.Popen(
            argv, cwd=tmp_path, env=slurm_env(slurm), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:  # gsn2's worker runs tasks
            runs = list(ws.glob("*/run_*"))
            if runs and (runs[0] / "events.jsonl").exists():
                on = hosts_of_done(runs[0])
                if "gsn2" in on.values():
                    break
            assert time.monotonic() < deadline, (tmp_path / "head.out").read_text()
            time.sleep(0.2)
        slurm.kill_node("gsn2")
        rc = head.wait(150)
    finally:
        if head.poll() is None:
            head.kill()
            head.wait()
    text = (tmp_path / "head.out").read_text()
    run = only_run(ws)
    summary = summary_of(run)
    assert summary["counts"]["done"] == count, text
    reclaimed = [e for e in events_of(run) if e.get("ev") == "requeued"]
    assert reclaimed, text  # gsn2's running tasks came back through its expired leases
    assert rc in (0, 1), text
    if os.environ.get("GPUSWARM_SLURM_DEBUG"):
        print(text)


@pytest.mark.timeout(240)
def test_research_round_over_two_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``research loop`` on the head of a two-node allocation: the round's variants run on
    both nodes (the runner it starts is a head: a worker on the other node), one ledger."""
    from integration_support import make_research_repo, research_ledger

    repo = make_research_repo(tmp_path / "repo")
    steps = " && ".join(
        shlex.join(step)
        for step in (
            [*PY, "research", "init", "-C", str(repo), "--tag", "s1", "--edit", "train.py",
             "--protect", "prepare.py", "--command", f"{sys.executable} train.py",
             "--gpus", "auto", "--timeout", "30s", "--linger", "1s"],
            [*PY, "research", "loop", "-C", str(repo), "--proposer", "mutate", "--mode",
             "rounds", "--max-experiments", "4", "--seed", "2"],
        )
    )  # fmt: skip
    stop = shlex.join([*PY, "research", "stop", "-C", str(repo)])
    argv = [
        "salloc", "--gres=gpu:2", "-N2",
        "srun", "--overlap", "-N1", "-n1", "-w", "gsn1",
        "sh", "-c", f"{steps}; rc=$?; {stop}; exit $rc",
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=tmp_path, env=slurm_env(slurm), capture_output=True, text=True, timeout=220,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finished = [e for e in research_ledger(repo, "s1") if e.get("ev") == "finished"]
    assert len(finished) >= 4, finished
    hosts = {str(e.get("slot", "")).split("-gpu")[0] for e in finished}
    assert hosts <= {"gsn1", "gsn2"} and "gsn1" in hosts, finished
    # the round's runner is a head: it started a worker on gsn2, which registered its slots
    # (whether it got a variant before gsn1's slots took them all is a race of the round)
    workers = [
        e
        for path in repo.rglob("events.jsonl")
        for e in events_of(path.parent)
        if e.get("ev") == "supervisor_started" and str(e["slots"][0]).startswith("gsn2-")
    ]
    assert workers, done.stdout[-3000:]
