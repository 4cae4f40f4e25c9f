"""What a supervisor needs besides the queue, from a config (a new run) or a run.json (resume).

Composition only: the slots (placement), the provisions (checked now, before anything runs),
the reliability settings and the backend's name, and the run.json snapshot of them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuswarm import __version__
from gpuswarm.config.halt import canonical_halt
from gpuswarm.config.load import LoadedConfig, spec_hash
from gpuswarm.config.models import DockerConfig, RayConfig, RunConfig
from gpuswarm.core.errors import BadInputError, ConfigError, RunDirError
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import SHAPES
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.exec.base import Backend, BackendOptions, backend_names, create_backend
from gpuswarm.exec.sandbox import Provision, check_provision_dest
from gpuswarm.placement.devices import GpuSet, Vendor, model_matches
from gpuswarm.placement.gpus import Slot, memory_slots, parse_gpu_spec, plan_slots
from gpuswarm.placement.hostlock import gpu_keys
from gpuswarm.supervise.supervisor import SupervisorConfig


def resolve_provisions(loaded: LoadedConfig) -> tuple[Provision, ...]:
    """Check every provisioned file now, so a missing credential fails before anything runs."""
    home = loaded.config.home
    out = []
    for i, item in enumerate(home.provision if home else []):
        src = Path(item.src).expanduser()
        src = src if src.is_absolute() else loaded.base_dir / src
        where = f"{loaded.path or '<config>'}: home.provision[{i}].src"
        if not src.exists():
            raise ConfigError(f"{where}: {src} does not exist; fix the path or remove the entry")
        out.append(Provision(src=src, dest=check_provision_dest(item.dest)))
    return tuple(out)


RESUME_READS = ("preflight", "after_all", "docker", "ray", "backend", "slurm")  # by shape only


def redact_config(value: Any, base_dir: str | Path | None = None) -> Any:
    """A config dump fit for run.json: the run's redactor (this process's secrets, every env's,
    the provisioned files'): env by name, value and shape, commands and strings by value and
    shape. The settings a resume reads back (``RESUME_READS``) are redacted by shape only, as
    before: a secret's value that happens to be part of an image name must not change it."""
    if not isinstance(value, dict):
        return SHAPES.tree(value)
    redactor = run_redactor(config=value, base_dir=base_dir)
    return {
        k: (SHAPES if k in RESUME_READS else redactor).tree({k: v})[k] for k, v in value.items()
    }


def run_info(loaded: LoadedConfig, gpus: GpuSet, slots: list[Slot]) -> dict[str, Any]:
    cfg = loaded.config
    home = cfg.home
    return {
        "gpuswarm": __version__,
        "name": loaded.name,
        "workspace": str(loaded.workspace),
        "source": str(loaded.path) if loaded.path else "<stdin>",
        "base_dir": str(loaded.base_dir),
        "fingerprint": spec_hash(loaded),
        "gpus": gpus.spec,
        "vendor": gpus.vendor.value,
        "gpu_ids": list(gpus.ids),
        "gpus_per_task": cfg.gpus_per_task,
        "tasks_per_gpu": max((s.share + 1 for s in slots), default=cfg.tasks_per_gpu),
        "slot_count": len(slots),
        "home": {
            "isolate": bool(home and home.isolate),
            "provision": [{"src": p.src, "dest": p.dest} for p in (home.provision if home else [])],
        },
        "settings": _settings(cfg),
        "config": redact_config(cfg.model_dump(mode="json"), loaded.base_dir),
        "task_count": len(loaded.tasks),
        "hosts": [socket.gethostname()],
    }


def _settings(cfg: RunConfig) -> dict[str, Any]:
    rel = cfg.reliability
    return {
        "lease_ttl": rel.lease_ttl,
        "retry_backoff": rel.retry_backoff or 0.0,
        "breaker_failures": rel.breaker.failures,
        "breaker_window": rel.breaker.window,
        "breaker_cooldown": rel.breaker.cooldown,
        "max_log_bytes": int(rel.max_log_mb * (1 << 20)),
        # issue 19: an undeclared task's share of its GPU (the tasks_per_gpu the config set)
        "gpu_share": cfg.tasks_per_gpu if "tasks_per_gpu" in cfg.model_fields_set else 1,
        "release_timeout": rel.gpu_release_timeout,
        "halt": cfg.halt,  # issue 28: every session's, unless --halt says otherwise
    }


@dataclass(frozen=True)
class Setup:
    """What a supervisor needs besides the queue: slots, task defaults, reliability settings."""

    slots: list[Slot]
    base_dir: Path
    isolate: bool
    provisions: tuple[Provision, ...]
    settings: dict[str, Any]
    preflight: tuple[str, ...] = ()  # run once per slot before it claims anything
    after_all: str | None = None  # run once after every slot finished
    backend: str = "local"  # what runs the attempts (exec.base.create_backend)
    docker: DockerConfig | None = None  # backend: docker's settings
    ray: RayConfig | None = None  # backend: ray's settings; its slots come from the cluster
    gpus_spec: str | None = None  # backend: ray: --gpus filters the cluster's GPUs
    gpus_per_task: int = 1
    tasks_per_gpu: int = 1

    def backend_options(self, paths: RunPaths, owner: str, max_log_bytes: int) -> BackendOptions:
        """What the run's backend is built with."""
        return BackendOptions(
            max_log_bytes=max_log_bytes,
            scope=f"{paths.root.name}/",
            run_dir=str(paths.root),
            owner=owner,
            docker=self.docker,
            base_dir=str(self.base_dir),
            ray=self.ray,
            gpus_per_task=self.gpus_per_task,
            tasks_per_gpu=self.tasks_per_gpu,
            gpus=self.gpus_spec,
        )

    def supervisor_config(self, owner: str) -> SupervisorConfig:
        known = set(SupervisorConfig.__dataclass_fields__)
        extra = {k: v for k, v in self.settings.items() if k in known}
        return SupervisorConfig(
            self.slots,
            self.base_dir,
            owner,
            self.isolate,
            self.provisions,
            **extra,
            backend=self.backend,
            base_env=dict(os.environ),  # read once, here: the attempts start from it
            preflight=self.preflight,
        )


def setup_from_info(info: dict[str, Any], gpus_spec: str | None) -> Setup:
    """The setup of an existing run (its run.json), on the GPUs given now or its own."""
    per_task, per_gpu = int(info.get("gpus_per_task", 1)), int(info.get("tasks_per_gpu", 1))
    if backend_of(info) == "ray":  # the cluster's slots: made by the backend once it joins
        spec = gpus_spec or str(info.get("gpus") or "auto")
        slots: list[Slot] = []
    else:
        slots = plan_slots(
            parse_gpu_spec(gpus_spec or str(info.get("gpus") or "auto")), per_task, per_gpu
        )
        spec = None
    home = info.get("home", {})
    provisions = tuple(
        Provision(src=Path(p["src"]).expanduser(), dest=p["dest"])
        for p in home.get("provision", [])
    )
    base_dir = Path(info.get("base_dir", "."))
    config = info.get("config") or {}
    backend = backend_of(info)
    return Setup(
        slots,
        base_dir,
        bool(home.get("isolate")) or backend == "docker",  # a container always gets a HOME
        provisions,
        info.get("settings", {}),
        tuple(config.get("preflight") or ()),
        config.get("after_all"),
        backend,
        docker_of(info),
        ray_of(info),
        spec,
        per_task,
        per_gpu,
    )


def with_halt(setup: Setup, halt: str | None) -> Setup:
    """``--halt`` over the run's ``halt:`` for this session (``never``: none); the run's own
    (run.json) checked, a bad one named."""
    if halt is not None:
        return replace(setup, settings={**setup.settings, "halt": canonical_halt(halt)})
    try:
        canonical_halt(setup.settings.get("halt") or "never")
    except ValueError as exc:
        raise RunDirError(f"run.json: settings.halt is not valid ({exc})") from None
    return setup


def with_ray_address(setup: Setup, address: str) -> Setup:
    """``resume --ray-address``: the run's ray settings on another cluster address."""
    if setup.backend != "ray":
        raise ConfigError(f"--ray-address: this run's backend is {setup.backend}, not ray")
    base = setup.ray.model_dump() if setup.ray is not None else {}
    try:
        ray = RayConfig.model_validate({**base, "address": address})
    except ValidationError as exc:
        raise ConfigError(f"--ray-address: {exc.errors()[0]['msg']}") from None
    return replace(setup, ray=ray)


def ray_of(info: dict[str, Any]) -> RayConfig | None:
    """The ray: settings a run was made with (run.json); None for other backends."""
    if backend_of(info) != "ray":
        return None
    raw = (info.get("config") or {}).get("ray") or {}
    try:
        return RayConfig.model_validate(raw)
    except ValidationError as exc:
        raise RunDirError(f"run.json: config.ray is not valid ({exc.errors()[0]['msg']})") from None


def docker_of(info: dict[str, Any]) -> DockerConfig | None:
    """The docker: settings a run was made with (run.json); None for other backends."""
    raw = (info.get("config") or {}).get("docker")
    if raw is None:
        return None
    try:
        return DockerConfig.model_validate(raw)
    except ValidationError as exc:
        raise RunDirError(
            f"run.json: config.docker is not valid ({exc.errors()[0]['msg']})"
        ) from None


def recovery_backend(info: dict[str, Any]) -> Backend:
    """The backend that ends a dead owner's leftovers of a run (resume, check --repair)."""
    docker = docker_of(info)
    return create_backend(backend_of(info), BackendOptions(docker=docker, ray=ray_of(info)))


def check_backend_ready(loaded: LoadedConfig, gpus_spec: str | None = None) -> None:
    """Before anything is made: the backend can run attempts at all (docker: the daemon
    answers, the image is present, mount sources exist); BackendError (exit 2) otherwise."""
    cfg = loaded.config
    options = BackendOptions(
        docker=cfg.docker, base_dir=str(loaded.base_dir), ray=cfg.ray, gpus=gpus_spec or cfg.gpus
    )
    backend = create_backend(cfg.backend, options)
    try:
        backend.check()
    except BadInputError as exc:
        raise type(exc)(f"{loaded.path or '<config>'}: {exc}") from None


def plan(loaded: LoadedConfig, gpus_spec: str | None) -> tuple[GpuSet, list[Slot]]:
    if loaded.config.backend == "ray":  # the cluster's GPUs, filtered by the spec: no slots yet
        return GpuSet(Vendor.NVIDIA, (), gpus_spec or loaded.config.gpus or "auto"), []
    gpus = parse_gpu_spec(gpus_spec or loaded.config.gpus or "auto")
    slots = plan_slots(gpus, loaded.config.gpus_per_task, tasks_per_gpu(loaded, gpus))
    check_accelerators(loaded, gpus)
    return gpus, slots


def check_accelerators(loaded: LoadedConfig, gpus: GpuSet) -> None:
    """A task's ``accelerator:`` must name a model among the run's GPUs (a task no slot may
    take would wait forever): ConfigError naming the task and the models there are."""
    found = loaded.tasks
    tasks = found if isinstance(found, list) else [found[0]] if len(found) else []
    names = sorted({g.name for g in gpus.gpus})
    where = loaded.path or "the command list"
    for task in tasks:
        wanted = task.accelerator
        if wanted and not any(model_matches(n, wanted) for n in names):
            raise ConfigError(
                f"{where}: task {task.name!r}: accelerator {wanted!r} is none of this "
                f"run's GPUs ({', '.join(names)}); name one of them, or pick GPUs of that "
                "model with --gpus"
            )


def tasks_per_gpu(loaded: LoadedConfig, gpus: GpuSet) -> int:
    """Slots per GPU: the config's ``tasks_per_gpu`` when it sets one (a hard cap); else, when
    tasks declare ``gpu_memory`` (issue 19), as many as the smallest need fits on the smallest
    GPU (:func:`memory_slots`); else 1."""
    cfg = loaded.config
    if "tasks_per_gpu" in cfg.model_fields_set or cfg.gpus_per_task > 1:
        return cfg.tasks_per_gpu
    tasks = loaded.tasks
    if isinstance(tasks, list):
        needs = [t.gpu_memory_mb for t in tasks if t.gpu_memory_mb]
    else:  # a command list: one template for every line
        needs = [tasks[0].gpu_memory_mb] if len(tasks) and tasks[0].gpu_memory_mb else []
    return memory_slots(needs, [g.memory_mb for g in gpus.gpus if g.memory_mb])


def check_backend(loaded: LoadedConfig) -> None:
    name = loaded.config.backend
    if name not in backend_names():
        known = ", ".join(backend_names())
        raise ConfigError(
            f"{loaded.path or '<config>'}: backend: unknown backend {name!r}; known: {known}"
        )


def gpu_keys_of(slots: list[Slot]) -> list[str]:
    return gpu_keys(slots[0].vendor.value, {i for s in slots for i in s.gpu_ids}) if slots else []


def backend_of(info: dict[str, Any]) -> str:
    """The backend a run's attempts ran on, from its run.json (runs before backends: local)."""
    return str((info.get("config") or {}).get("backend") or "local")
