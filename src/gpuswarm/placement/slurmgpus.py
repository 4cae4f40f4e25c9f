"""``--gpus auto`` inside a Slurm allocation: the GPUs Slurm granted this node.

Slurm names the granted GPUs of a step in ``SLURM_STEP_GPUS`` and of a batch script in
``SLURM_JOB_GPUS`` (gres indices: the order of ``gres.conf``'s ``File=`` lines, which is the
devices' minor numbers, nvidia-smi's ids with ``AutoDetect=nvml``), and sets
``CUDA_VISIBLE_DEVICES`` for the processes it starts. :func:`granted_ids` reads them (the step's
first); :func:`restrict` keeps those of the GPUs discovery found: by id where each one is among
them, or all of them where the node shows only the granted ones (``ConstrainDevices=yes``: the
job's device cgroup hides the others, and the ids are renumbered).

``GPUSWARM_SLURM_SIM_GPUS=1`` makes the granted GPUs simulated ones where no GPU is found (a test
cluster's gres on device files: what gpuswarm's Slurm tests run on). Outside an allocation
(``SLURM_JOB_ID`` unset) nothing here applies.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuswarm.core.errors import GpuSpecError
from gpuswarm.placement.devices import Gpu, GpuSet, Vendor, as_int

SIM_VAR = "GPUSWARM_SLURM_SIM_GPUS"


def in_allocation(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_JOB_ID", "").strip())


def on_compute_node(environ: Mapping[str, str]) -> bool:
    """Inside a job's step or batch script (``SLURMD_NODENAME`` set), not ``salloc``'s shell."""
    return bool(environ.get("SLURMD_NODENAME", "").strip())


def _ids(value: str, var: str) -> tuple[int, ...]:
    ids: list[int] = []
    for token in (t.strip() for t in value.split(",")):
        index = as_int(token)
        if index is None:
            raise GpuSpecError(
                f"{var}={value}: {token!r} is not a GPU index; gpuswarm reads the GPUs Slurm "
                "granted from it (--gpus auto): pass --gpus 0,1 to name them instead"
            )
        ids.append(index)
    return tuple(dict.fromkeys(ids))


def granted_ids(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """The GPUs Slurm granted here (None: not in an allocation, or no GPU named)."""
    if not in_allocation(environ):
        return None
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = environ.get(var, "").strip()
        if value:
            return _ids(value, var)
    return None


def not_on_node_error() -> GpuSpecError:
    return GpuSpecError(
        "--gpus auto: this is salloc's shell on the submit host (SLURM_JOB_ID is set, "
        "SLURMD_NODENAME is not), and the allocation's GPUs are on its nodes; run gpuswarm on "
        "the first node: srun --overlap --nodes=1 --ntasks=1 gpuswarm run ... (or in an sbatch "
        "script); it starts a worker on each other node itself"
    )


def simulated(environ: Mapping[str, str]) -> GpuSet | None:
    """The granted GPUs as simulated ones, where ``GPUSWARM_SLURM_SIM_GPUS=1`` asks for it."""
    if environ.get(SIM_VAR) != "1":
        return None
    ids = granted_ids(environ)
    if not ids:
        return None
    gpus = tuple(Gpu(i, "sim", Vendor.SIM) for i in ids)
    return GpuSet(Vendor.SIM, gpus, "auto")


def restrict(found: GpuSet, environ: Mapping[str, str]) -> GpuSet | None:
    """``found`` cut to what Slurm granted (None: no Slurm grant to apply)."""
    ids = granted_ids(environ)
    if not ids:
        return None
    by_id = {g.index: g for g in found.gpus}
    if all(i in by_id for i in ids):
        return GpuSet(found.vendor, tuple(by_id[i] for i in ids), found.spec)
    if len(found.gpus) == len(ids):  # a device cgroup shows the granted ones only
        return found
    raise GpuSpecError(
        f"Slurm granted GPUs {','.join(map(str, ids))} here, but this node shows "
        f"{found.describe()}; pass --gpus with the ids to use"
    )
