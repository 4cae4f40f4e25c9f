"""Variants as tasks of the experiment's core run: the run itself, a variant's task, queueing
and withdrawing it, and where each task is now. Everything goes through ``gpuswarm.app.api``
(research never touches the queue's folders); the export a task runs in is ``exports.py``, what
an ended task produced is ``outcome.py``, the background runner that serves the run is
``runner.py``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from gpuswarm.app import api
from gpuswarm.config.backends import settings_of
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.errors import ResearchError
from gpuswarm.core.paths import RunPaths
from gpuswarm.research.experiment import MEMORY_METRIC, ExperimentConfig, ExpPaths
from gpuswarm.research.exports import export, remove_export
from gpuswarm.research.exports import protected_changes as _protected_changes
from gpuswarm.research.journal import Variant
from gpuswarm.research.payloads import RunningVariant


def create_queue(paths: ExpPaths, cfg: ExperimentConfig) -> str:
    """Create the experiment's core run (no tasks yet); returns its folder relative to root."""
    spec = api.NewRunSpec(
        workspace=paths.root,
        folder="queue",
        name=f"research-{cfg.tag}",
        base_dir=paths.repo,
        gpus=api.plan_gpus(cfg.gpus, backend=cfg.backend, settings=settings_of(cfg)),
        source="research",
        # crashes are results here, not a sick GPU: no circuit breaker, no retries
        settings={
            "lease_ttl": 30.0,
            "retry_backoff": 0.0,
            "breaker_failures": 0,
            "breaker_window": 60.0,
            "max_log_bytes": 64 << 20,
            "linger": cfg.linger,
        },
        config=_backend_config(cfg),
    )
    run = api.create_run(spec)
    return str(run.root.relative_to(paths.root))


def _backend_config(cfg: ExperimentConfig) -> dict[str, str | Mapping[str, object]]:
    """The run's recorded config: the experiment's tag, and what runs its variants (its
    notifier's and its backend's settings as JSON, the latter under the backend's name)."""
    config: dict[str, str | Mapping[str, object]] = {"research": cfg.tag}
    if cfg.notify is not None:  # issue 37: the runner's notifier (docs/notifications.md)
        config["notify"] = cfg.notify.model_dump(mode="json")
    settings = settings_of(cfg)
    if cfg.backend != "local" and settings is not None:
        config.update({"backend": cfg.backend, cfg.backend: settings.model_dump(mode="json")})
    return config


def run_paths(paths: ExpPaths, cfg: ExperimentConfig) -> RunPaths:
    return RunPaths(paths.root / cfg.run)


def slot_count(paths: ExpPaths, cfg: ExperimentConfig) -> int:
    return api.slot_count(run_paths(paths, cfg))


# -- queueing ----------------------------------------------------------------------------------
def task_for(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> TaskSpec:
    command: list[str] | str = cfg.command if cfg.shell else shlex.split(cfg.command)
    return TaskSpec(
        id=v.id,
        name=v.description[:60] or v.id,
        command=command,
        shell=cfg.shell,
        cwd=str(paths.export_dir(v.id)),
        env={"GPUSWARM_VARIANT": v.id, "GPUSWARM_COMMIT": v.commit},
        timeout=cfg.timeout,
        grace=10.0,
        max_attempts=1,
        priority=10 if v.kind == "baseline" else 0,
        metrics={cfg.metric: cfg.metric_pattern, MEMORY_METRIC: cfg.memory_pattern},
        accelerator=_platform(v),
    )


def _platform(v: Variant) -> str | None:
    """The GPU model a baseline run is pinned to (several models: one baseline per model)."""
    wanted = v.meta.get("platform")
    return wanted if isinstance(wanted, str) and wanted else None


def enqueue(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> None:
    """Export a variant that has no task yet and put its task in pending/ (durably)."""
    export(paths, cfg, v)
    changed = _protected_changes(paths, cfg, v)  # checked before the run, and after it
    if changed:
        remove_export(paths, v.id)
        raise ResearchError(f"{v.id} changes protected file(s) {', '.join(changed)}")
    run = run_paths(paths, cfg)
    task = task_for(paths, cfg, v)
    seq = int(v.id[1:])
    api.submit(run, task, seq)  # touches the marker live runners watch


def withdraw(paths: ExpPaths, cfg: ExperimentConfig, variant_id: str) -> bool:
    """Take a variant's task out of the queue before a runner claims it; False when it is not
    there (claimed meanwhile, or never queued)."""
    return api.withdraw(run_paths(paths, cfg), variant_id)


def cancel(paths: ExpPaths, cfg: ExperimentConfig, variant_id: str, reason: str) -> None:
    """Stop a variant's task wherever it is (a running one: by its supervisor, within about
    a second; an ended one is left as it is)."""
    api.cancel(run_paths(paths, cfg), variant_id, reason)


def remove_cut_writes(paths: ExpPaths, cfg: ExperimentConfig) -> int:
    """Queue writes a crash cut short (the runner may be re-queueing an attempt right now).
    Returns how many went."""
    return api.remove_cut_writes(run_paths(paths, cfg))


def tasks(paths: ExpPaths, cfg: ExperimentConfig) -> dict[str, api.TaskRef]:
    """Variant id -> the state and queue entry of its task (one look at each state)."""
    return api.task_states(run_paths(paths, cfg))


def finished_ids(paths: ExpPaths, cfg: ExperimentConfig) -> set[str]:
    return api.finished_ids(run_paths(paths, cfg))


def running(paths: ExpPaths, cfg: ExperimentConfig) -> dict[str, RunningVariant]:
    """Variant id -> {slot, since, log} for the tasks in running/ (claim time = file mtime)."""
    return {
        vid: {"slot": str(r["slot"]), "since": float(r["since"]), "log": r["log"]}
        for vid, r in api.running(run_paths(paths, cfg)).items()
    }
