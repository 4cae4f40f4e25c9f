"""``backend: slurm`` from the login node, on a real Slurm (issue 36): gpuswarm submits the
worker jobs itself (sbatch), watches them (squeue), submits again when one ends with work left,
and scancels them on stop. The test process is the login node (no job of its own)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hookkit import Receiver
from slurm_cluster import SlurmCluster
from slurm_support import done_once, events_of, hosts_of_done, only_run, slurm_env, write_config

from gpuswarm.core.paths import RunPaths
from gpuswarm.dashboard.runhub import RunHub

PY = [sys.executable, "-m", "gpuswarm"]


def _gpuswarm(
    slurm: SlurmCluster, cwd: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PY, *args],
        cwd=cwd,
        env=slurm_env(slurm),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _jobs(run: Path) -> list[dict[str, Any]]:
    data = json.loads((run / "slurm" / "jobs.json").read_text())
    jobs: list[dict[str, Any]] = data["jobs"]
    return jobs


def test_login_node_run_over_two_nodes(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 8, 1)
    ws = tmp_path / "runs"
    hook = Receiver()  # the run's webhooks: the login-node process sends them, once
    try:
        done = _gpuswarm(
            slurm, tmp_path, "run", str(cfg), "--backend", "slurm", "--slurm-nodes", "2",
            "--slurm-time", "10:00", "--slurm-gpus-per-node", "2", "--plain", "--no-report",
            "--workspace", str(ws), "--notify", hook.url,
        )  # fmt: skip
    finally:
        hook.close()
    assert done.returncode == 0, done.stdout + done.stderr
    finished = [e for e in hook.events() if e["event"] == "run_finished"]
    assert len(finished) == 1 and finished[0]["counts"].get("done") == 8, hook.events()
    run = only_run(ws)
    done_once(run, 8)
    assert set(hosts_of_done(run).values()) == {"gsn1", "gsn2"}
    jobs = _jobs(run)
    assert len(jobs) == 1 and jobs[0]["nodes"] in ("gsn[1-2]", "gsn1,gsn2"), jobs
    assert (run / "slurm" / f"job-{jobs[0]['job']}.out").exists()
    assert jobs[0]["state"] == "COMPLETED", jobs  # its workers ended once the work was done
    shown = _gpuswarm(slurm, tmp_path, "status", str(run)).stdout
    assert f"slurm job {jobs[0]['job']}: completed on gsn" in shown, shown
    made = _gpuswarm(slurm, tmp_path, "report", str(run))
    assert made.returncode == 0, made.stderr
    page = (run / "report.html").read_text()
    assert "<h2>Slurm</h2>" in page and f"slurm job {jobs[0]['job']}: completed" in page
    hub = RunHub("r1", RunPaths(run))  # the dashboard's view of the run
    assert any(f"slurm job {jobs[0]['job']}: completed" in x for x in hub.view_json()["slurm"])
    # the login-node process ran no attempt: every one ran in a worker on a node
    starts = [e for e in events_of(run) if e.get("ev") == "supervisor_started"]
    assert {e["slots"][0].split("-gpu")[0] for e in starts} == {"gsn1", "gsn2"}


def test_rejected_job_is_bad_input_with_slurms_words(slurm: SlurmCluster, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 2, 0.1)
    ws = tmp_path / "runs"
    done = _gpuswarm(
        slurm, tmp_path, "run", str(cfg), "--backend", "slurm", "--slurm-partition", "bogus",
        "--plain", "--workspace", str(ws),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "invalid partition" in done.stderr.lower(), done.stderr
    assert str(cfg) in done.stderr
    assert not ws.exists() or not list(ws.glob("*/run_*"))  # nothing made


@pytest.mark.timeout(180)
def test_cancelled_job_is_resubmitted(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The worker job is scancel'ed mid-run: gpuswarm submits another, whose workers take the
    dead job's tasks back (their leases expire) and finish the run; nothing done runs again."""
    count = 8
    cfg = write_config(tmp_path, count, 2)
    ws = tmp_path / "runs"
    argv = [
        *PY, "run", str(cfg), "--backend", "slurm", "--slurm-nodes", "1",
        "--slurm-gpus-per-node", "2", "--plain", "--no-report", "--workspace", str(ws),
    ]  # fmt: skip
    with (tmp_path / "login.out").open("w") as out:
        login = subprocess.Popen(
            argv, cwd=tmp_path, env=slurm_env(slurm), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            runs = list(ws.glob("*/run_*"))
            if runs and (runs[0] / "slurm" / "jobs.json").exists():
                started = [e for e in events_of(runs[0]) if e.get("ev") == "started"]
                if len(started) >= 3:
                    break
            assert time.monotonic() < deadline, (tmp_path / "login.out").read_text()
            time.sleep(0.2)
        first = _jobs(runs[0])[0]["job"]
        subprocess.run(["scancel", first], env=slurm_env(slurm), check=True, timeout=30)
        rc = login.wait(150)
    finally:
        if login.poll() is None:
            login.kill()
            login.wait()
    text = (tmp_path / "login.out").read_text()
    assert rc == 0, text
    run = only_run(ws)
    done_once(run, count)
    jobs = _jobs(run)
    assert len(jobs) >= 2, jobs
    assert jobs[0]["state"] == "CANCELLED", jobs
    assert f"job {jobs[1]['job']}" in text, text
    print(text)


@pytest.mark.timeout(120)
def test_stop_cancels_the_jobs(slurm: SlurmCluster, tmp_path: Path) -> None:
    """SIGTERM to the login-node process: its jobs are scancel'ed; ``gpuswarm resume RUN`` on
    the login node submits again and finishes the run (nothing done runs again)."""
    cfg = write_config(tmp_path, 6, 2)
    ws = tmp_path / "runs"
    argv = [
        *PY, "run", str(cfg), "--backend", "slurm", "--slurm-gpus-per-node", "2", "--plain",
        "--no-report", "--workspace", str(ws),
    ]  # fmt: skip
    with (tmp_path / "login.out").open("w") as out:
        login = subprocess.Popen(
            argv, cwd=tmp_path, env=slurm_env(slurm), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            runs = list(ws.glob("*/run_*"))
            if runs and any(e.get("ev") == "started" for e in events_of(runs[0])):
                break
            assert time.monotonic() < deadline, (tmp_path / "login.out").read_text()
            time.sleep(0.2)
        login.terminate()
        rc = login.wait(60)
    finally:
        if login.poll() is None:
            login.kill()
            login.wait()
    text = (tmp_path / "login.out").read_text()
    assert rc == 130, text
    job = _jobs(only_run(ws))[0]["job"]
    deadline = time.monotonic() + 30
    while True:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], env=slurm_env(slurm), capture_output=True,
            text=True, timeout=30, check=False,
        ).stdout.strip()  # fmt: skip
        if state in ("", "CANCELLED"):
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.3)
    run = only_run(ws)
    again = _gpuswarm(slurm, tmp_path, "resume", str(run), "--plain", "--no-report")
    assert again.returncode == 0, again.stdout + again.stderr
    done_once(run, 6)
    assert len(_jobs(run)) == 2  # the first session's job is kept in jobs.json


def test_run_folder_the_nodes_cannot_see_stops_the_run(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A workspace the nodes do not see (here a folder each node has a tmpfs of its own over):
    the first worker job cannot start there; the run stops saying so instead of submitting
    job after job."""
    cfg = write_config(tmp_path, 2, 0.1)
    ws = slurm.local / f"runs-{tmp_path.name}"
    try:
        done = _gpuswarm(
            slurm, tmp_path, "run", str(cfg), "--backend", "slurm", "--plain", "--no-report",
            "--workspace", str(ws),
        )  # fmt: skip
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "do the nodes see the run folder" in done.stdout + done.stderr
    assert (done.stdout + done.stderr).count("submitted worker job") == 1, done.stderr
