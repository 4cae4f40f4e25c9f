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
from gpuswarm.metrics import ResultFileError, flatten, load_result_file, parse_metrics
from gpuswarm.paths import RunPaths
from gpuswarm.process import AttemptEnd, EndKind, LaunchSpec
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


STALE_SLACK_SECONDS = 1.0  # filesystem clocks may lag time.time() a little


def completion_path(paths: RunPaths, task: TaskSpec, values: dict[str, str]) -> Path | None:
    """Where the attempt's completion file must appear (None: the task has none)."""
    if not task.done_when:
        return None
    return paths.task_dir(task.id) / render(task.done_when, values)


def set_aside_stale(
    paths: RunPaths, task: TaskSpec, values: dict[str, str], n: int
) -> tuple[Path, Path] | None:
    """Move whatever is at the completion path before attempt ``n`` starts into the attempt's
    folder (``attempt-<n>/stale-<name>``): only a file this attempt writes may count, and
    nothing of the task's is deleted. Returns (from, to) when something was moved."""
    target = completion_path(paths, task, values)
    if target is None or not os.path.lexists(target):
        return None
    folder = paths.attempt_log(task.id, n).parent
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"stale-{target.name}"
    k = 2
    while os.path.lexists(dest):
        dest = folder / f"stale-{k}-{target.name}"
        k += 1
    os.rename(target, dest)
    return target, dest


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
    if skipped(task, end):
        reason = f"skipped (exit {end.returncode} = skip_exit_code)"
        record["reason"] = reason
        return Outcome(State.SKIPPED, reason, record)
    if not end.ok:
        return Outcome(State.FAILED, end.reason, record)
    target = completion_path(paths, task, values)
    if target is not None:
        try:
            result = load_result_file(target)
            _written_since(target, end.started)
        except ResultFileError as exc:
            reason = f"exit 0 but {exc}"
            record["reason"] = reason
            return Outcome(State.FAILED, reason, record)
        data["result"] = flatten(result)
    return Outcome(State.DONE, end.reason, record)


def skipped(task: TaskSpec, end: AttemptEnd) -> bool:
    """The task declared this end a skip (``skip_exit_code``): not a failure, not a success."""
    return (
        task.skip_exit_code is not None
        and end.kind is EndKind.EXITED
        and end.returncode == task.skip_exit_code
    )


def _written_since(target: Path, started: float) -> None:
    """A completion file last changed before the attempt started was not written by it (a copy
    that kept its old time, e.g. ``cp -p`` or ``shutil.copytree`` of a folder shipping one)."""
    try:
        mtime = target.stat().st_mtime
    except OSError:
        return  # it parsed a moment ago; a task that removes it now is judged by what was read
    if mtime < started - STALE_SLACK_SECONDS:
        raise ResultFileError(
            f"completion file {target.name} was not written by this attempt (last changed "
            f"{started - mtime:.0f}s before it started: a copied old file?)"
        )
