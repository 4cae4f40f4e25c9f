"""What a supervisor needs besides the queue, from a config (a new run) or a run.json (resume):
:class:`Setup`, built by :func:`gpuswarm.app.prepare.prepare` alone.

Composition only: the slots, the provisions, the reliability settings and the backend's name,
and the run.json snapshot of them (the plan and the checks before anything is made:
``app/planning.py``); and, for a backend that drives workers elsewhere instead
(``BackendPlugin.driver``), its :class:`RunDriver`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, cast

from pydantic import BaseModel, ValidationError

from gpuswarm.app.output import Output
from gpuswarm.config.backends import (
    BackendPlugin,
    backend_names,
    plugin_of,
    plugins,
)
from gpuswarm.config.budget import BudgetConfig, check_usd, parse_tokens
from gpuswarm.config.commands import CommandTasks, task_dumps
from gpuswarm.config.halt import canonical_halt
from gpuswarm.config.load import LoadedConfig, spec_hash
from gpuswarm.config.models import RunConfig
from gpuswarm.core.errors import ConfigError, RunDirError
from gpuswarm.core.fsutil import COMPACT
from gpuswarm.core.jsontemplate import JsonTemplate, TemplateError, hole
from gpuswarm.core.models import Descriptor
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import SHAPES
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.exec.base import Backend, BackendOptions, create_backend
from gpuswarm.exec.sandbox import Provision
from gpuswarm.outputs.runreport import RunReport
from gpuswarm.placement.devices import GpuSet
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.created import Created
from gpuswarm.store.runinfo import RunInfo, RunRecord, RunSettings
from gpuswarm.store.runs import NewRun
from gpuswarm.store.staging import Encoded, Templated
from gpuswarm.supervise.supervisor import SupervisorConfig


def resume_reads() -> tuple[str, ...]:
    """The settings a resume reads back from run.json, redacted by shape only: every
    backend's block among them."""
    return ("preflight", "after_all", *(p for p in plugins() if p != "local"), "backend")


def redact_config(value: Any, base_dir: str | Path | None = None) -> Any:
    """A config dump fit for run.json: the run's redactor (this process's secrets, every env's,
    the provisioned files'): env by name, value and shape, commands and strings by value and
    shape. The settings a resume reads back (:func:`resume_reads`) are redacted by shape only, as
    before: a secret's value that happens to be part of an image name must not change it."""
    if not isinstance(value, dict):
        return SHAPES.tree(value)
    redactor = run_redactor(config=value, base_dir=base_dir)
    reads = resume_reads()
    return {k: (SHAPES if k in reads else redactor).tree({k: v})[k] for k, v in value.items()}


def run_info(loaded: LoadedConfig, gpus: GpuSet, slots: list[Slot]) -> RunInfo:
    """run.json of a run made from ``loaded``."""
    cfg = loaded.config
    home = cfg.home
    return RunInfo(
        name=loaded.name,
        workspace=loaded.workspace,
        source=str(loaded.path) if loaded.path else "<stdin>",
        base_dir=loaded.base_dir,
        fingerprint=spec_hash(loaded),
        gpus=gpus.spec,
        vendor=gpus.vendor.value,
        gpu_ids=gpus.ids,
        gpus_per_task=cfg.gpus_per_task,
        tasks_per_gpu=max((s.share + 1 for s in slots), default=cfg.tasks_per_gpu),
        slot_count=len(slots),
        isolate=bool(home and home.isolate),
        provision=[{"src": p.src, "dest": p.dest} for p in (home.provision if home else [])],
        settings=_settings(cfg),
        config=redact_config(cfg.model_dump(mode="json"), loaded.base_dir),
        task_count=len(loaded.tasks),
    )


STREAM_FIRST = 2000  # a bigger run's first tasks; the rest streams (store/spool.py)


def new_run(
    loaded: LoadedConfig,
    gpus: GpuSet,
    slots: list[Slot],
    *,
    stream: bool = False,
    created: Created | None = None,
) -> NewRun:
    """What :func:`gpuswarm.store.runs.create_run` makes of a loaded config; ``stream``: a
    run of more than :data:`STREAM_FIRST` tasks is created with those, the others spooled (its
    supervisor moves them into pending/ while the first ones run); ``created`` remembers what
    is written (store/created.py)."""
    first = STREAM_FIRST if stream and len(loaded.tasks) > STREAM_FIRST else None
    info = run_info(loaded, gpus, slots).to_json()
    tasks = queued(loaded)
    return NewRun(loaded.name, loaded.workspace, info, tasks, stream_after=first, created=created)


def queued(loaded: LoadedConfig) -> Iterable[TaskDump | Encoded]:
    """The tasks to enqueue, one at a time (never a copy): a command list's descriptors filled
    into one encoded template (the same bytes, several times cheaper: a
    :class:`~gpuswarm.store.staging.Templated`), others' dumps."""
    tasks = loaded.tasks
    # a plain command list only: a subclass adds fields per dump (--repeats: its repeat)
    if type(tasks) is CommandTasks and len(tasks):
        encoded = _encoded(tasks)
        if encoded is not None:
            return encoded
    return task_dumps(tasks)


def _encoded(tasks: CommandTasks) -> Templated | None:
    shared = tasks.with_holes()
    if shared.get("skip_reason"):  # excluded tasks are created skipped: the long way
        return None
    raw = Descriptor.new(shared, 0).raw
    raw["seq"] = hole(3)
    try:  # id twice (the descriptor's and its task's), name, command, seq
        template = JsonTemplate(raw, (2, 1, 1, 1), COMPACT.encode)
    except TemplateError:
        return None
    return Templated(template, int(shared.get("priority") or 0), tasks.rows())


def _settings(cfg: RunConfig) -> RunSettings:
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
        **budget_settings(cfg.budget),  # issue 34: what its agents may spend
    }


@dataclass(frozen=True)
class Setup:
    """What a supervisor needs besides the queue: slots, task defaults, reliability settings."""

    slots: list[Slot]
    base_dir: Path
    isolate: bool
    provisions: tuple[Provision, ...]
    settings: RunSettings
    preflight: tuple[str, ...] = ()  # run once per slot before it claims anything
    after_all: str | None = None  # run once after every slot finished
    backend: str = "local"  # what runs the attempts (exec.base.create_backend)
    backend_settings: BaseModel | None = None  # its own settings (config/backends.py)
    gpus_spec: str | None = None  # a backend whose slots are its own: --gpus filters its GPUs
    gpus_per_task: int = 1
    tasks_per_gpu: int = 1

    def backend_options(self, paths: RunPaths, owner: str, max_log_bytes: int) -> BackendOptions:
        """What the run's backend is built with."""
        return BackendOptions(
            max_log_bytes=max_log_bytes,
            scope=f"{paths.root.name}/",
            run_dir=str(paths.root),
            owner=owner,
            settings=self.backend_settings,
            base_dir=str(self.base_dir),
            gpus_per_task=self.gpus_per_task,
            tasks_per_gpu=self.tasks_per_gpu,
            gpus=self.gpus_spec,
        )

    def __getattr__(self, name: str) -> Any:
        """``setup.<backend name>``: that backend's settings, when it is the run's (as a
        config's block is ``config.<name>``); None for another backend's."""
        if name in plugins() and name != "backend":
            return self.backend_settings if name == self.backend else None
        raise AttributeError(name)

    def supervisor_config(self, owner: str) -> SupervisorConfig:
        return SupervisorConfig(
            self.slots,
            self.base_dir,
            owner,
            self.isolate,
            self.provisions,
            **_supervisor_settings(self.settings),
            backend=self.backend,
            base_env=dict(os.environ),  # read once, here: the attempts start from it
            preflight=self.preflight,
        )


def _supervisor_settings(settings: RunSettings) -> RunSettings:
    """The settings of run.json a SupervisorConfig takes: those another version wrote that it
    does not know are left out."""
    known = SupervisorConfig.__dataclass_fields__
    return cast(RunSettings, {k: v for k, v in settings.items() if k in known})


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


def with_backend_options(setup: Setup, command: str, values: Mapping[str, Any]) -> Setup:
    """A command's backend options over the run's settings (``resume --ray-address``): only the
    run's own backend's (ConfigError naming the flag otherwise)."""
    for plugin in plugins().values():
        given = [o for o in plugin.options_for(command) if o.given(values)]
        if not given:
            continue
        if plugin.name != setup.backend:
            raise ConfigError(
                f"{given[0].decls[0]}: this run's backend is {setup.backend}, not {plugin.name}"
            )
        assert plugin.apply_options is not None
        settings = plugin.apply_options(setup.backend_settings, values)
        setup = replace(setup, backend_settings=settings)
    return setup


def budget_settings(budget: BudgetConfig | None) -> RunSettings:
    """run.json's settings of ``budget:`` (none without one)."""
    if budget is None:
        return {}
    return {
        "budget_usd": budget.usd,
        "budget_tokens": budget.tokens,
        "budget_on_exceed": budget.on_exceed,
    }


def with_budget(setup: Setup, usd: float | None, tokens: int | None = None) -> Setup:
    """``--budget-usd`` / ``--budget-tokens`` over the run's ``budget.usd`` / ``.tokens``
    (resume: raised for this session and, by
    :func:`gpuswarm.app.reconfigure.remember_budget`, in run.json)."""
    settings = setup.settings.copy()
    if usd is not None:
        settings["budget_usd"] = check_usd(usd)
    if tokens is not None:
        settings["budget_tokens"] = parse_tokens(tokens)
    return replace(setup, settings=settings)


def backend_settings_of(info: RunRecord) -> BaseModel | None:
    """The settings of its backend a run was made with (run.json); its defaults where the run
    has no block (a backend that needs one: None)."""
    plugin = _plugin(info.backend)
    if plugin.settings is None:
        return None
    raw = info.config.get(plugin.name)
    if raw is None and plugin.needs_block:
        return None
    try:
        return plugin.settings.model_validate(raw or {})
    except ValidationError as exc:
        raise RunDirError(
            f"run.json: config.{plugin.name} is not valid ({exc.errors()[0]['msg']})"
        ) from None


def run_plugin(info: RunRecord) -> BackendPlugin:
    """The plugin of the backend a run was made with (run.json); RunDirError naming it when it
    is unknown here."""
    return _plugin(info.backend)


def _plugin(name: str) -> BackendPlugin:
    try:
        return plugin_of(name)
    except KeyError:
        raise RunDirError(
            f"run.json: backend {name!r} is unknown here; known: {', '.join(backend_names())}"
        ) from None


def recovery_backend(info: RunRecord) -> Backend:
    """The backend that ends a dead owner's leftovers of a run (resume, check --repair)."""
    options = BackendOptions(settings=backend_settings_of(info))
    return create_backend(info.backend, options)


class RunDriver(Protocol):
    """A backend whose workers run elsewhere (``BackendPlugin.driver``: slurm's worker jobs):
    this host makes the run and drives them, with no supervisor, slot or GPU work here."""

    def start(
        self, loaded: LoadedConfig, gpus_spec: str | None, *, suffix: str | None, output: Output
    ) -> RunReport: ...

    def resume(
        self, paths: RunPaths, info: RunRecord, output: Output, *, retry_failed: bool
    ) -> RunReport | None:
        """The run resumed and driven to its end; None: supervised here, as any run."""
        ...


def driver_of(backend: str) -> RunDriver | None:
    """The driver of the backend called ``backend`` (imported only now); None when it has
    none (a supervisor here runs its attempts) or is unknown (checked elsewhere)."""
    plugin = plugins().get(backend)
    if plugin is None or not plugin.driver:
        return None
    module, _, name = plugin.driver.partition(":")
    return cast(RunDriver, getattr(importlib.import_module(module), name))


def resume_driven(
    paths: RunPaths, info: RunRecord, output: Output, *, retry_failed: bool
) -> RunReport | None:
    """A resume of a run whose backend has a driver, by that driver; None: supervised here."""
    driver = driver_of(info.backend)
    if driver is None:
        return None
    return driver.resume(paths, info, output, retry_failed=retry_failed)
