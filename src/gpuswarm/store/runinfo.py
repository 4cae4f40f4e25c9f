"""run.json as a run is created: the one builder of its record.

Every run is made with one (``engine`` from a config, through :func:`gpuswarm.app.setup.run_info`;
``api.create_run`` for a client's run that has no tasks yet), so the keys, their order and their
defaults are written in one place. :func:`gpuswarm.store.runs.create_run` adds where the run was
put (``run_dir``) and when (``created``); what a resume reads back is read by ``app.setup``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuswarm import __version__


@dataclass(frozen=True)
class RunInfo:
    """What run.json says of a run when it is made."""

    name: str  # the run's name (status, ls, the index)
    workspace: Path  # the run folder is under it
    source: str  # the config file (``<stdin>``), or the client that made the run
    base_dir: Path  # relative task paths start here
    gpus: str  # the --gpus spec the run was planned with
    vendor: str
    gpu_ids: Sequence[int]
    slot_count: int
    settings: Mapping[str, Any]  # lease_ttl, retry_backoff, breaker, log cap, halt, ...
    config: Mapping[str, Any]  # the config as recorded (redacted by the caller)
    fingerprint: str = ""  # the spec hash a resume compares (none for a client's run)
    gpus_per_task: int = 1
    tasks_per_gpu: int = 1
    isolate: bool = False  # home.isolate: each slot a private HOME
    provision: Sequence[Mapping[str, str]] = field(default_factory=list)  # {src, dest}
    task_count: int = 0

    def to_json(self) -> dict[str, Any]:
        """The record run.json holds (this version of gpuswarm, this host)."""
        return {
            "gpuswarm": __version__,
            "name": self.name,
            "workspace": str(self.workspace),
            "source": self.source,
            "base_dir": str(self.base_dir),
            "fingerprint": self.fingerprint,
            "gpus": self.gpus,
            "vendor": self.vendor,
            "gpu_ids": list(self.gpu_ids),
            "gpus_per_task": self.gpus_per_task,
            "tasks_per_gpu": self.tasks_per_gpu,
            "slot_count": self.slot_count,
            "home": {
                "isolate": self.isolate,
                "provision": [{"src": p["src"], "dest": p["dest"]} for p in self.provision],
            },
            "settings": dict(self.settings),
            "config": dict(self.config),
            "task_count": self.task_count,
            "hosts": [socket.gethostname()],
        }
