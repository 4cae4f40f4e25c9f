"""Slurm's formats as gpuswarm reads them (issue 36): the time left, the GPUs granted."""

from __future__ import annotations

import pytest

from gpuswarm.core.errors import GpuSpecError
from gpuswarm.exec.slurm.allocation import parse_time_left
from gpuswarm.placement import slurmgpus
from gpuswarm.placement.devices import Gpu, GpuSet, Vendor
from gpuswarm.placement.gpus import discover


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5", 300.0),  # minutes
        ("0:45", 45.0),  # minutes:seconds
        ("3:58:21", 14301.0),  # hours:minutes:seconds
        ("1-02:03:04", 93784.0),  # days-hours:minutes:seconds
        ("2-03", 183600.0),  # days-hours
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
    ],
)
def test_time_left(text: str, seconds: float | None) -> None:
    assert parse_time_left(text) == seconds


def _found(n: int) -> GpuSet:
    return GpuSet(Vendor.NVIDIA, tuple(Gpu(i, "H100", Vendor.NVIDIA) for i in range(n)), "auto")


def test_granted_gpus_restrict_discovery() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_STEP_GPUS": "2,3"}
    cut = slurmgpus.restrict(_found(4), env)
    assert cut is not None and cut.ids == (2, 3)
    # the step's GPUs before the job's; outside an allocation nothing applies
    both = {**env, "SLURM_JOB_GPUS": "0,1,2,3"}
    assert slurmgpus.granted_ids(both) == (2, 3)
    assert slurmgpus.granted_ids({"SLURM_STEP_GPUS": "1"}) is None


def test_device_cgroup_shows_only_the_granted() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "5,6"}
    cut = slurmgpus.restrict(_found(2), env)  # ConstrainDevices: the node shows 2, renumbered
    assert cut is not None and cut.ids == (0, 1)
    with pytest.raises(GpuSpecError, match="granted GPUs 5,6"):
        slurmgpus.restrict(_found(3), env)


def test_bad_gpu_list_names_the_variable() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,x"}
    with pytest.raises(GpuSpecError, match="SLURM_JOB_GPUS=0,x"):
        slurmgpus.granted_ids(env)


def test_auto_in_salloc_shell_says_where_to_run() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    with pytest.raises(GpuSpecError, match="srun --overlap"):
        discover(run=lambda argv: None, nvml=False, environ=env)


def test_simulated_grant_only_when_asked() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_STEP_GPUS": "0,1"}
    assert slurmgpus.simulated(env) is None
    sim = slurmgpus.simulated({**env, slurmgpus.SIM_VAR: "1"})
    assert sim is not None and sim.vendor is Vendor.SIM and sim.ids == (0, 1)
