"""The ray backend's declaration (config/backends.py): its settings (``ray:``, defaults when
absent), the options it adds to ``run``, ``resume`` and ``research init``, and what it is (its
slots are the cluster's, one driver per run). Loading it loads neither :mod:`.backend` nor
``ray``: both are imported only when a run uses the backend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuswarm.config.backends import BackendPlugin, Moved, Option
from gpuswarm.config.errors import flag_error
from gpuswarm.core.errors import ConfigError
from gpuswarm.exec.ray.settings import RayConfig

_FLAGS = {"ray_address": "address", "ray_ship": "ship", "ray_setup": "setup"}


def apply_options(block: BaseModel | None, values: Mapping[str, Any]) -> BaseModel:
    """``--ray-address`` (``--ray-ship``, ``--ray-setup``) over the config's ``ray:`` block."""
    base = block.model_dump() if block is not None else {}
    base.update({key: values[flag] for flag, key in _FLAGS.items() if values.get(flag)})
    try:
        return RayConfig.model_validate(base)
    except ValidationError as exc:
        text = str(flag_error(exc))
        for flag, key in _FLAGS.items():
            text = text.replace(f"--{key}:", f"--{flag.replace('_', '-')}:")
        raise ConfigError(text) from None


def _refuse(backend: str) -> str:
    return f"--ray-address is ray's, but the backend is {backend}; drop one"


def resume_moved(block: BaseModel, before: Mapping[str, Any]) -> Moved | None:
    """``resume --ray-address``: what the journal's ``slots`` event says when the address moved
    from run.json's (``before``: its ``ray:`` block); None when it did not."""
    assert isinstance(block, RayConfig)
    was = before.get("address", "auto")
    if was == block.address:
        return None
    return {"change": "moved", "address": block.address, "before": was}


PLUGIN = BackendPlugin(
    name="ray",
    factory="gpuswarm.exec.ray.backend:RayBackend",
    settings=RayConfig,
    options=(
        Option(
            ("--ray-address",),
            "ray: the cluster to join: auto, HOST:PORT or ray://HOST:PORT (implies --backend ray)",
        ),
        Option(
            ("--ray-address",),
            "ray: the cluster to join now (a new head: HOST:PORT)",
            frozenset({"resume"}),
        ),
        Option(
            ("--ray-address",),
            "ray: the cluster: auto, HOST:PORT or ray://HOST:PORT",
            frozenset({"research init"}),
        ),
        Option(
            ("--ray-ship",),
            "ray: ship each variant's folder to its node "
            "(auto: when the node lacks the run folder)",
            frozenset({"research init"}),
            choices=("auto", "always", "never"),
        ),
        Option(
            ("--ray-setup",),
            "ray: a command run once per node before its first variant",
            frozenset({"research init"}),
        ),
    ),
    apply_options=apply_options,
    refuse_options=_refuse,
    owns_slots=True,
    slots_phrase="the Ray cluster's GPUs",
    single_driver=(
        "a Ray run has one driver (its slot actors are the run's); nodes that join the cluster "
        "get slots by themselves: use `gpuswarm resume` if it is not live"
    ),
    resume_moved=resume_moved,
)
