"""A new run's plan and the checks before anything is made: its GPUs and slots (a task's
``accelerator:`` among them, ``tasks_per_gpu`` or what declared memory fits), its provisioned
files, its backend known and ready, and the host GPU locks its slots take."""

from __future__ import annotations

from pathlib import Path

from gpuswarm.config.backends import backend_names, plugins, settings_of
from gpuswarm.config.load import LoadedConfig
from gpuswarm.core.errors import BadInputError, ConfigError
from gpuswarm.exec.base import BackendOptions, create_backend
from gpuswarm.exec.sandbox import Provision, check_provision_dest
from gpuswarm.placement.devices import GpuSet, Vendor, model_matches
from gpuswarm.placement.gpus import Slot, memory_slots, parse_gpu_spec, plan_slots
from gpuswarm.placement.hostlock import gpu_keys


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


def check_backend_ready(loaded: LoadedConfig, gpus_spec: str | None = None) -> None:
    """Before anything is made: the backend can run attempts at all (docker: the daemon
    answers, the image is present, mount sources exist); BackendError (exit 2) otherwise."""
    cfg = loaded.config
    options = BackendOptions(
        settings=settings_of(cfg), base_dir=str(loaded.base_dir), gpus=gpus_spec or cfg.gpus
    )
    backend = create_backend(cfg.backend, options)
    try:
        backend.check()
    except BadInputError as exc:
        raise type(exc)(f"{loaded.path or '<config>'}: {exc}") from None


def plan(loaded: LoadedConfig, gpus_spec: str | None) -> tuple[GpuSet, list[Slot]]:
    found = plugins().get(loaded.config.backend)
    if found is not None and found.owns_slots:  # its GPUs, filtered by the spec: no slots yet
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
