"""``backend: slurm``'s attempts: on a compute node, under a worker job's ``gpuswarm work``, each
is a local process (the node's GPUs, the run folder every node sees). The login node runs none:
its process drives the worker jobs (slurmdriver.py, the plugin's ``driver``)."""

from __future__ import annotations

from gpuswarm.exec.local.backend import LocalBackend


class SlurmBackend(LocalBackend):
    """The local backend, named as the run's (a worker's attempts are this node's processes)."""

    name = "slurm"
