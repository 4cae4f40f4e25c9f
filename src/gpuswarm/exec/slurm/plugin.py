"""The slurm backend's declaration (config/backends.py): its settings (``slurm:``, defaults when
absent), the ``--slurm-*`` options it adds to ``run``, and what it is: from the login node a
driver (``slurmdriver.py``) submits and watches worker jobs; no supervisor, slot or GPU work
here. Their nodes' ``gpuswarm work`` run the attempts as local processes (:mod:`.backend`).
Loading it loads neither: both are imported only when a run uses the backend.

A run inside an allocation (``--gpus auto`` under ``SLURM_JOB_ID``) is no backend: any
backend's run may be one (engine.py composes it through slurmdriver.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuswarm.config.backends import BackendPlugin, Option
from gpuswarm.config.errors import flag_error
from gpuswarm.core.errors import ConfigError
from gpuswarm.exec.slurm.settings import SlurmSettings

# option dest -> its field in the slurm: block
_FLAGS = {
    "slurm_nodes": "nodes",
    "slurm_time": "time",
    "slurm_partition": "partition",
    "slurm_gpus_per_node": "gpus_per_node",
    "slurm_account": "account",
    "slurm_qos": "qos",
    "slurm_stop_before": "stop_before",
}


def apply_options(block: BaseModel | None, values: Mapping[str, Any]) -> BaseModel:
    """The ``--slurm-*`` flags over the config's ``slurm:`` block (a ConfigError naming the
    flag)."""
    base = block.model_dump() if block is not None else {}
    base.update({key: values[flag] for flag, key in _FLAGS.items() if values.get(flag)})
    try:
        return SlurmSettings.model_validate(base)
    except ValidationError as exc:
        text = str(flag_error(exc))
        for flag, key in _FLAGS.items():
            text = text.replace(f"--{key.replace('_', '-')}:", f"--{flag.replace('_', '-')}:")
        raise ConfigError(text) from None


def _refuse(backend: str) -> str:
    flags = ", ".join("--" + f.replace("_", "-") for f in _FLAGS)
    return f"--backend {backend}: {flags} are slurm's; add --backend slurm (or drop them)"


PLUGIN = BackendPlugin(
    name="slurm",
    factory="gpuswarm.exec.slurm.backend:SlurmBackend",
    settings=SlurmSettings,
    options=(
        Option(("--slurm-nodes",), "slurm: nodes per worker job (implies --backend slurm)"),
        Option(("--slurm-time",), "slurm: each worker job's time limit (4:00:00)"),
        Option(("--slurm-partition",), "slurm: the partition of the worker jobs"),
        Option(("--slurm-gpus-per-node",), "slurm: GPUs per node of each worker job"),
        Option(("--slurm-account",), "slurm: the account the worker jobs are charged to"),
        Option(("--slurm-qos",), "slurm: the quality of service of the worker jobs"),
        Option(
            ("--slurm-stop-before",),
            "slurm: how long before a worker job's end its workers stop warm (60s, 5m)",
        ),
    ),
    apply_options=apply_options,
    refuse_options=_refuse,
    driver="gpuswarm.app.slurmdriver:DRIVER",
)
