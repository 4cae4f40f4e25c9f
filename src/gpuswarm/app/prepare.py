"""The one place a run's :class:`~gpuswarm.app.setup.Setup` is built: :func:`prepare`, by
keyword, for a run being made (``gpuswarm run``) or an existing one (``resume``, ``work``,
:func:`gpuswarm.app.api.serve`), with this session's overrides (``--halt``, ``--budget-usd``,
``--budget-tokens``, ``resume``'s backend options)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Final

from gpuswarm.app.setup import (
    Setup,
    backend_settings_of,
    run_plugin,
    with_backend_options,
    with_budget,
    with_halt,
)
from gpuswarm.config.backends import plugin_of, settings_of
from gpuswarm.config.load import LoadedConfig
from gpuswarm.exec.sandbox import Provision
from gpuswarm.placement.devices import GpuSet
from gpuswarm.placement.gpus import Slot, parse_gpu_spec, plan_slots
from gpuswarm.store.runinfo import RunRecord


class Keep(Enum):
    """``halt=KEEP``: the run's ``halt:`` is neither replaced nor checked."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP


def prepare(
    *,
    info: RunRecord,
    config: LoadedConfig | None = None,
    planned: tuple[GpuSet, list[Slot]] | None = None,
    provisions: tuple[Provision, ...] = (),
    gpus: str | None = None,
    halt: str | Keep | None = KEEP,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    backend_options: Mapping[str, Any] | None = None,
) -> Setup:
    """A run's setup. A run being made: from its ``config``, on the GPUs and slots ``planned``
    for it, with its ``provisions`` checked, ``info`` the run.json made of them (its settings).
    An existing run (no ``config``): from its run.json ``info``, on the GPUs ``gpus`` names now
    or its own.

    Then this session's overrides: ``halt`` over the run's ``halt:`` (None: the run's own,
    checked; :data:`KEEP`: left as it is), ``budget_usd`` / ``budget_tokens`` over its budget,
    ``backend_options`` (``resume --ray-address``) over its backend's settings."""
    if config is not None:
        assert planned is not None, "a run being made is planned first (setup.plan)"
        setup = _of_config(config, planned, provisions, info)
    else:
        setup = _of_run(info, gpus)
    if not isinstance(halt, Keep):
        setup = with_halt(setup, halt)
    setup = with_budget(setup, budget_usd, budget_tokens)
    if backend_options:  # e.g. a cluster that moved (a new head after a head loss)
        setup = with_backend_options(setup, "resume", backend_options)
    return setup


def _of_config(
    loaded: LoadedConfig,
    planned: tuple[GpuSet, list[Slot]],
    provisions: tuple[Provision, ...],
    info: RunRecord,
) -> Setup:
    gpus, slots = planned
    cfg = loaded.config
    plugin = plugin_of(cfg.backend)
    # a container always gets a private HOME (its caches persist across the slot's attempts)
    isolate = bool(cfg.home and cfg.home.isolate) or plugin.isolates_home
    return Setup(
        slots,
        loaded.base_dir,
        isolate,
        provisions,
        info.settings,
        tuple(cfg.preflight),
        cfg.after_all,
        cfg.backend,
        settings_of(cfg),
        gpus.spec if plugin.owns_slots else None,
        cfg.gpus_per_task,
        cfg.tasks_per_gpu,
    )


def _of_run(info: RunRecord, gpus_spec: str | None) -> Setup:
    """The setup of an existing run (its run.json), on the GPUs given now or its own."""
    per_task, per_gpu = info.gpus_per_task, info.tasks_per_gpu
    if run_plugin(info).owns_slots:  # made by the backend once it joins its cluster
        spec = gpus_spec or info.gpus or "auto"
        slots: list[Slot] = []
    else:
        slots = plan_slots(parse_gpu_spec(gpus_spec or info.gpus or "auto"), per_task, per_gpu)
        spec = None
    home = info.home
    provisions = tuple(
        Provision(src=Path(p["src"]).expanduser(), dest=p["dest"])
        for p in home.get("provision", [])
    )
    base_dir = Path(info.base_dir)
    config = info.config
    backend = info.backend
    return Setup(
        slots,
        base_dir,
        bool(home.get("isolate")) or run_plugin(info).isolates_home,
        provisions,
        info.settings,
        tuple(config.get("preflight") or ()),
        config.get("after_all"),
        backend,
        backend_settings_of(info),
        spec,
        per_task,
        per_gpu,
    )
