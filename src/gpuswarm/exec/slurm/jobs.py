"""Worker jobs from the login node (``backend: slurm``): the script, ``sbatch``, the states.

A worker job is one batch script: the ``setup:`` lines, then ``srun`` of one ``gpuswarm work
RUN --gpus auto`` per node (each takes the GPUs Slurm granted its node, and bounds its claims
by the job's end: exec/slurm/allocation.py). Its output goes to ``slurm/job-<id>.out`` in the
run folder. ``sbatch --test-only`` checks the request before the run is made (a partition Slurm
does not know is exit 2 with Slurm's own words); :func:`job_states` reads ``squeue``, and
``sacct`` for jobs squeue no longer lists (without accounting: ended).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.errors import BackendError, ConfigError
from gpuswarm.exec.slurm.settings import SlurmSettings

TIMEOUT = 60.0
ACTIVE = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
     "REQUEUE_FED", "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESV_DEL_HOLD"}
)  # fmt: skip


@dataclass
class JobState:
    job: str
    state: str
    nodes: str = ""
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def script_text(settings: SlurmSettings, run_dir: Path) -> str:
    work = [sys.executable, "-m", "gpuswarm", "work", str(run_dir), "--gpus", "auto",
            "--plain", "--no-report"]  # fmt: skip
    lines = [
        "#!/bin/bash",
        "# a gpuswarm worker job: one `gpuswarm work` per node of the allocation",
        "set -eo pipefail",
        *settings.setup,
        "srun --ntasks-per-node=1 --kill-on-bad-exit=0 " + shlex.join(work),
    ]
    return "\n".join(lines) + "\n"


def _sbatch_argv(settings: SlurmSettings, name: str, out_dir: Path) -> list[str]:
    return [
        "sbatch", "--parsable", f"--job-name={name}",
        f"--output={out_dir}/job-%j.out", f"--chdir={out_dir}",
        *settings.sbatch_options(),
    ]  # fmt: skip


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"slurm: {argv[0]}: {exc}; is Slurm installed here?") from None


def _said(done: subprocess.CompletedProcess[str]) -> str:
    return " ".join((done.stderr or done.stdout).split())[-600:]


def test_submit(settings: SlurmSettings, script: Path, where: str) -> None:
    """``sbatch --test-only``: Slurm accepts the request (ConfigError with its words if not)."""
    argv = [*_sbatch_argv(settings, "gpuswarm-check", script.parent), "--test-only", str(script)]
    done = _run(argv)
    if done.returncode != 0:
        raise ConfigError(f"{where}: Slurm refuses the worker job: {_said(done)}")


def submit(settings: SlurmSettings, script: Path, name: str, out_dir: Path) -> str:
    done = _run([*_sbatch_argv(settings, name, out_dir), str(script)])
    if done.returncode != 0:
        raise ConfigError(f"slurm: sbatch refused the worker job: {_said(done)}")
    return done.stdout.strip().split(";")[0]


def cancel(jobs: list[str]) -> None:
    if jobs:
        _run(["scancel", *jobs])


def job_states(jobs: list[str]) -> dict[str, JobState]:
    """Each job's state (squeue, then sacct for those it no longer lists; else ENDED)."""
    if not jobs:
        return {}
    found: dict[str, JobState] = {}
    done = _run(["squeue", "-h", "-t", "all", "-j", ",".join(jobs), "-o", "%i|%T|%N|%r"])
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[0] in jobs:
            found[parts[0]] = JobState(parts[0], parts[1], parts[2], parts[3])
    missing = [j for j in jobs if j not in found]
    if missing:
        fields = "JobID,State,NodeList"
        acct = _run(["sacct", "-n", "-X", "-P", "-j", ",".join(missing), "-o", fields])
        for line in acct.stdout.splitlines() if acct.returncode == 0 else []:
            parts = line.split("|")
            if len(parts) >= 2 and parts[0] in missing:
                state = parts[1].split()[0] if parts[1] else "ENDED"
                found[parts[0]] = JobState(parts[0], state, parts[2] if len(parts) > 2 else "")
    for job in jobs:
        found.setdefault(job, JobState(job, "ENDED"))
    return found
