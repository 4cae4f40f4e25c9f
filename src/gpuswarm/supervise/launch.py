"""What the loop does between a claim and a launch: read the task, plan its attempt.

Nothing here waits: a descriptor whose task does not parse is set aside at once, and an older
completion file that could be mistaken for this attempt's is moved out of the way first.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.events import Ev
from gpuswarm.exec.base import Backend, LaunchSpec
from gpuswarm.exec.plan import launch_spec_for, set_aside_stale, values_for
from gpuswarm.placement.gpus import Slot
from gpuswarm.store.names import task_id_of
from gpuswarm.store.queue import Claimed
from gpuswarm.supervise.context import Shared
from gpuswarm.supervise.repeathome import base_env_of, home_of


@dataclass(frozen=True)
class Planned:
    """Attempt ``number`` of a task on a slot: its GPUs, placeholder values and launch spec."""

    number: int
    gpu_ids: tuple[int, ...]
    values: dict[str, str]
    spec: LaunchSpec


def task_of(run: Shared, claimed: Claimed) -> TaskSpec | None:
    """The claimed task; None (and the descriptor set aside) when it is not one we can run."""
    try:
        return TaskSpec.model_validate(claimed.data["task"])
    except ValidationError as exc:  # parseable JSON, but not a task we can run
        first = str(exc).splitlines()[1:2] or ["invalid"]
        run.queue.quarantine(claimed.path, "invalid-task")
        run.ledger.emit(
            Ev.CORRUPT,
            task=task_id_of(claimed.name),
            file=claimed.name,
            reason=f"invalid task: {first[0]}",
        )
        return None


def plan_attempt(
    run: Shared,
    task: TaskSpec,
    slot: Slot,
    claimed: Claimed,
    base_env: dict[str, str],
    backend: Backend,
) -> Planned:
    """The next attempt of ``task`` on ``slot``, with a stale completion file set aside.
    ``base_env``: the slot's; a repeat's own HOME goes over it (``backend`` makes it)."""
    base_env = base_env_of(backend, run, task, base_env)
    paths = run.paths
    number = claimed.desc.next_attempt
    gpu_ids = slot.gpu_ids[: task.gpus] if task.gpus else slot.gpu_ids
    values = values_for(paths, task, slot, gpu_ids, number)
    spec = launch_spec_for(
        paths,
        task,
        slot,
        gpu_ids,
        number,
        values,
        base_env=base_env,
        owner=run.cfg.owner,
        base_dir=run.cfg.base_dir,
        inherited=run.cfg.base_env,
        home=home_of(paths, task, slot.label, run.cfg.isolate_home),
    )
    try:
        stale = set_aside_stale(paths, task, values, number)
    except OSError as exc:  # judged by its time then (an old file never counts)
        run.ledger.emit(Ev.STALE_RESULT, task=task.id, attempt=number, error=str(exc))
        stale = None
    if stale is not None:
        run.ledger.emit(
            Ev.STALE_RESULT,
            task=task.id,
            attempt=number,
            file=str(stale[0].relative_to(paths.root)),
            moved_to=str(stale[1].relative_to(paths.root)),
        )
    return Planned(number, gpu_ids, values, spec)
