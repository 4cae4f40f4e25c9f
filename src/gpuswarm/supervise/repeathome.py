"""A private HOME per repeat (issue 34): repeat ``j`` of a task never shares its slot's HOME.

With an isolated HOME (``home.isolate``, an agent task, a backend that always isolates), a
task that is a repeat (``repeat`` set in its spec) runs with ``HOME`` (and every cache
variable) in ``homes/_repeats/<task-id>/`` instead of its slot's ``homes/<slot-id>/``: two
repeats of one task on one slot never see each other's agent state, and the folder is keyed
by the repeat's own task id, so its retries and a resume (on any slot) find it again. A slot
id starts with a letter or digit, so ``_repeats`` never is one.
"""

from __future__ import annotations

from pathlib import Path

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import Backend
from gpuswarm.exec.plan import slot_base_env
from gpuswarm.supervise.context import Shared

REPEATS_DIR = "_repeats"


def home_of(paths: RunPaths, task: TaskSpec, slot_label: str, isolate: bool) -> Path | None:
    """The HOME an attempt of ``task`` on slot ``slot_label`` runs with (None: none)."""
    if not isolate:
        return None
    if task.repeat is None:
        return paths.slot_home(slot_label)
    paths.task_dir(task.id)  # a safe folder name, as its workspace's
    return paths.homes / REPEATS_DIR / task.id


def base_env_of(
    backend: Backend, run: Shared, task: TaskSpec, slot_env: dict[str, str]
) -> dict[str, str]:
    """The base environment of an attempt of ``task``: its slot's (``slot_env``), or for a
    repeat with an isolated HOME the supervisor's with the repeat's own HOME over it, made
    (or refreshed, provisions copied again) right before the attempt."""
    cfg = run.cfg
    home = home_of(run.paths, task, "", cfg.isolate_home) if task.repeat is not None else None
    if home is None:
        return slot_env
    home.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return slot_base_env(cfg.base_env, backend.prepare_slot(home, cfg.provisions))
