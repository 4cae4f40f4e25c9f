"""What one attempt of a task is: its placeholder values, its launch spec, its record, its verdict.

Pure bookkeeping around :class:`gpuswarm.process.Attempt`, shared by the supervisor's loop and its
waiter threads; nothing here blocks or touches the queue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuswarm.config import TaskSpec, render, render_command, render_cwd, render_env
from gpuswarm.gpus import Slot, isolation_env
from gpuswarm.metrics import ResultFileError, flatten, parse_metrics, read_completion
from gpuswarm.paths import RunPaths
from gpuswarm.process import AttemptEnd, LaunchSpec
from gpuswarm.queue import State


@dataclass
class Outcome:
    """What one attempt led to."""

    state: State
    reason: str
    record: dict[str, Any] = field(default_factory=dict)


def values_for(
    paths: RunPaths, task: TaskSpec, slot: Slot, gpu_ids: tuple[int, ...], n: int
) -> dict[str, str]:
    """The placeholder values of attempt ``n`` of ``task`` on ``slot``."""
    return {
        **task.vars,
        "workspace": str(paths.task_dir(task.id)),
        "run_dir": str(paths.root),
        "task_id": task.id,
        "name": task.name,
        "attempt": str(n),
        "gpu_ids": ",".join(map(str, gpu_ids)),
        "gpu": str(gpu_ids[0]) if gpu_ids else "",
        "slot": str(slot.index),
        "slot_id": slot.label,
    }


def launch_spec_for(
    paths: RunPaths,
    task: TaskSpec,
    slot: Slot,
    gpu_ids: tuple[int, ...],
    n: int,
    values: dict[str, str],
    *,
    base_env: dict[str, str],
    owner: str,
    base_dir: Path,
) -> LaunchSpec:
    """The process to start: argv, environment (isolation + task + identity), cwd, log."""
    env = dict(base_env)
    env.update(render_env(task, values))
    env.update(isolation_env(slot, gpu_ids))
    env.update(
        GPUSWARM_RUN_DIR=str(paths.root),
        GPUSWARM_TASK_ID=task.id,
        GPUSWARM_TASK_NAME=task.name,
        GPUSWARM_TASK_WORKSPACE=values["workspace"],
        GPUSWARM_ATTEMPT=str(n),
        GPUSWARM_OWNER=owner,
        GPUSWARM_SLOT_ID=slot.label,  # unique in the run: <host>-gpu3, <host>-gpu3.1
    )
    if "task_dir" in task.vars:
        env["GPUSWARM_TASK_DIR"] = task.vars["task_dir"]
    return LaunchSpec(
        argv=render_command(task, values),
        env=env,
        cwd=render_cwd(task, values, base_dir),
        log_path=paths.attempt_log(task.id, n),  # Attempt.launch makes its folder
        timeout=task.timeout,
        grace=task.grace,
        token=f"{paths.root.name}/{task.id}/{n}",
    )


def slot_base_env(home_env: dict[str, str]) -> dict[str, str]:
    """The supervisor's environment with the slot's private home over it."""
    return {**os.environ, **home_env}


def record_of(end: AttemptEnd, slot: Slot, gpu_ids: tuple[int, ...], n: int) -> dict[str, Any]:
    """The attempt's entry in its descriptor's ``attempts`` list."""
    return {
        "n": n,
        "slot": slot.label,
        "gpus": list(gpu_ids),
        "started": round(end.started, 4),
        "ended": round(end.ended, 4),
        "duration": round(end.duration, 4),
        "kind": end.kind.value,
        "returncode": end.returncode,
        "signal": end.signal,
        "reason": end.reason,
        "oom": end.oom,
        "killed": end.killed,
    }


def judge(
    paths: RunPaths,
    task: TaskSpec,
    end: AttemptEnd,
    values: dict[str, str],
    record: dict[str, Any],
    data: dict[str, Any],
) -> Outcome:
    """Done = exit 0 and the completion file (if any) parses; its result lands in ``data``."""
    record["metrics"] = parse_metrics(paths.attempt_log(task.id, record["n"]), task.metrics)
    if not end.ok:
        return Outcome(State.FAILED, end.reason, record)
    if task.done_when:
        workspace = paths.task_dir(task.id)
        try:  # the task's own file: any problem with it fails this attempt, never the run
            result = flatten(read_completion(workspace, render(task.done_when, values)))
        except ResultFileError as exc:
            reason = f"exit 0 but {exc}"
            record["reason"] = reason
            return Outcome(State.FAILED, reason, record)
        data["result"] = result
    return Outcome(State.DONE, end.reason, record)
