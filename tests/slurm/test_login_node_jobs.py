"""``backend: slurm`` from the login node, on a real Slurm (issue 36), continued: a worker job
Slurm requeues is watched, not doubled; ``--slurm-stop-before`` reaches the worker jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster
from slurm_support import done_once, events_of, only_run, slurm_env, write_config

PY = [sys.executable, "-m", "gpuswarm"]


def _jobs(run: Path) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = json.loads((run / "slurm" / "jobs.json").read_text())["jobs"]
    return jobs


def _started(ws: Path, count: int, log: Path) -> Path:
    deadline = time.monotonic() + 60
    while True:
        runs = list(ws.glob("*/run_*"))
        jobs = runs and (runs[0] / "slurm" / "jobs.json").exists()
        if jobs and len([e for e in events_of(runs[0]) if e.get("ev") == "started"]) >= count:
            return runs[0]
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


@pytest.mark.timeout(180)
def test_requeued_job_is_watched_not_doubled(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``scontrol requeue`` of the running worker job: Slurm runs it again under the same id;
    gpuswarm submits no second job, the requeued one finishes the run (0 lost, 0 re-run)."""
    count = 8
    cfg = write_config(tmp_path, count, 2)
    ws = tmp_path / "runs"
    argv = [
        *PY, "run", str(cfg), "--backend", "slurm", "--slurm-nodes", "1",
        "--slurm-gpus-per-node", "2", "--plain", "--no-report", "--workspace", str(ws),
    ]  # fmt: skip
    log = tmp_path / "login.out"
    with log.open("w") as out:
        login = subprocess.Popen(
            argv, cwd=tmp_path, env=slurm_env(slurm), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        run = _started(ws, 3, log)
        job = _jobs(run)[0]["job"]
        subprocess.run(["scontrol", "requeue", job], env=slurm_env(slurm), check=True, timeout=30)
        rc = login.wait(150)
    finally:
        if login.poll() is None:
            login.kill()
            login.wait()
    text = log.read_text()
    assert rc == 0, text
    done_once(run, count)
    jobs = _jobs(run)
    assert [j["job"] for j in jobs] == [job], (jobs, text)  # no second job was submitted
    assert "submitted worker job" in text and text.count("submitted worker job") == 1, text
    changes = [e.get("change") for e in events_of(run) if e.get("ev") == "slots"]
    assert any(c in ("slurm_requeued", "slurm_pending") for c in changes[1:]), changes
    assert jobs[0]["state"] == "COMPLETED", jobs


@pytest.mark.timeout(180)
def test_stop_before_reaches_the_worker_jobs(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``--slurm-stop-before 45s`` with 1-minute worker jobs: each job's workers claim only
    what fits before the margin and stop warm ~15 s in; the next job finishes the run."""
    count = 14  # 14 s of work on 2 slots: more than the first job's ~15 s of claims allow
    cfg = write_config(tmp_path, count, 2, timeout="5s")
    ws = tmp_path / "runs"
    done = subprocess.run(
        [*PY, "run", str(cfg), "--backend", "slurm", "--slurm-nodes", "1", "--slurm-time", "1",
         "--slurm-stop-before", "45s", "--slurm-gpus-per-node", "2", "--plain", "--no-report",
         "--workspace", str(ws)],
        cwd=tmp_path, env=slurm_env(slurm), capture_output=True, text=True, timeout=170,
        check=False,
    )  # fmt: skip
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    run = only_run(ws)
    done_once(run, count)
    jobs = _jobs(run)
    assert len(jobs) >= 2, (jobs, text)
    first_out = (run / "slurm" / f"job-{jobs[0]['job']}.out").read_text()
    assert "allocation ends" in first_out, first_out


@pytest.mark.timeout(180)
def test_preempted_job_is_watched_not_doubled(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A job of the higher-priority partition ``urgent`` takes the worker job's GPUs: Slurm
    preempts the worker job and requeues it (PreemptMode=REQUEUE); gpuswarm waits for it to run
    again, submits no second job, and the run finishes (0 lost, 0 re-run)."""
    count = 8
    cfg = write_config(tmp_path, count, 2)
    ws = tmp_path / "runs"
    argv = [
        *PY, "run", str(cfg), "--backend", "slurm", "--slurm-nodes", "1",
        "--slurm-gpus-per-node", "2", "--plain", "--no-report", "--workspace", str(ws),
    ]  # fmt: skip
    log = tmp_path / "login.out"
    with log.open("w") as out:
        login = subprocess.Popen(
            argv, cwd=tmp_path, env=slurm_env(slurm), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        run = _started(ws, 3, log)
        job = _jobs(run)[0]
        node = job["nodes"] or "gsn1"
        urgent = [
            "sbatch", "--parsable", "-p", "urgent", f"--nodelist={node}", "--gres=gpu:2",
            f"--output={tmp_path}/urgent.out", "--wrap", "sleep 2",
        ]  # fmt: skip
        subprocess.run(urgent, env=slurm_env(slurm), check=True, timeout=30)
        rc = login.wait(150)
    finally:
        if login.poll() is None:
            login.kill()
            login.wait()
    text = log.read_text()
    assert rc == 0, text
    done_once(run, count)
    jobs = _jobs(run)
    assert [j["job"] for j in jobs] == [job["job"]], (jobs, text)  # watched, not doubled
    assert text.count("submitted worker job") == 1, text
    assert f"job {job['job']} pending" in text.split(f"job {job['job']} running", 1)[1], text
