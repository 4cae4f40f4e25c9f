"""What one attempt of a task is: its placeholder values, its launch spec, its record, its verdict.

Pure bookkeeping around an attempt (:mod:`gpuswarm.exec.base`), shared by the supervisor's
loop and its waiter threads; nothing here blocks or touches the queue.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpuswarm.agents.pricing import over_max_usd, usage_fields
from gpuswarm.config.models import TaskSpec
from gpuswarm.config.render import render_command, render_cwd, render_env
from gpuswarm.core.metrics import (
    RESULT_MAX_BYTES,
    ResultFileError,
    flatten,
    parse_metrics,
    read_completion,
)
from gpuswarm.core.models import AttemptRecord, EndKind, State
from gpuswarm.core.paths import RunPaths, host_slug
from gpuswarm.core.placeholders import render
from gpuswarm.core.taskfiles import inside, open_beneath, open_regular, same_bytes
from gpuswarm.exec.attemptenv import EnvOf, Identity, attempt_env
from gpuswarm.exec.base import AttemptEnd, LaunchSpec
from gpuswarm.placement.gpus import Slot


@dataclass
class Outcome:
    """What one attempt led to."""

    state: State
    reason: str
    record: AttemptRecord
    final: bool = False  # failed for good, whatever max_attempts says (over max_usd: issue 34)


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
    inherited: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> LaunchSpec:
    """The process to start: argv, environment (isolation + task + identity), cwd, log.

    ``inherited``: the supervisor's own environment (what ``base_env`` starts from); a variable
    set or changed over it is the attempt's own (``own_env``: what a container is given).
    ``home``: the slot's private HOME, when it has one (a container sees it at the same path)."""
    start = inherited if inherited is not None else {}
    workspace = paths.task_dir(task.id)
    cwd = render_cwd(task, values, base_dir)
    ident = Identity(
        run_dir=str(paths.root),
        task_id=task.id,
        name=task.name,
        workspace=values["workspace"],
        attempt=str(n),
        owner=owner,
        task_dir=task.vars.get("task_dir"),
    )
    direct = task.shell and isinstance(task.command, list)  # run direct: sh's env
    task_env = render_env(task, values) if task.env else {}
    env, own = attempt_env(
        EnvOf(base_env, task_env, slot, gpu_ids, ident, str(cwd) if direct else None, start)
    )
    return LaunchSpec(
        argv=render_command(task, values),
        env=env,
        cwd=cwd,
        log_path=paths.attempt_log(task.id, n),  # Attempt.launch makes its folder
        timeout=task.timeout,
        grace=task.grace,
        token=f"{paths.root.name}/{task.id}/{n}",
        devices=slot.devices_of(gpu_ids),
        vendor=slot.vendor,
        binds=(workspace,) if home is None else (workspace, home),
        own_env=own,  # set or changed over the supervisor's
        identity={"kind": "attempt", "task": task.id, "attempt": str(n), "slot": slot.label},
    )


def slot_base_env(base: Mapping[str, str], home_env: dict[str, str]) -> dict[str, str]:
    """The supervisor's environment (``base``, passed in) with the slot's private home over it."""
    return {**base, **home_env}


def record_of(end: AttemptEnd, slot: Slot, gpu_ids: tuple[int, ...], n: int) -> AttemptRecord:
    """The attempt's entry in its descriptor's ``attempts`` list."""
    return AttemptRecord.launched(
        n=n,
        slot=slot.label,
        gpus=gpu_ids,
        started=end.started,
        ended=end.ended,
        duration=end.duration,
        kind=end.kind,
        returncode=end.returncode,
        signal=end.signal,
        reason=end.reason,
        oom=end.oom,
        killed=end.killed,
        host=slot.host or host_slug(),
        accelerator=accelerator_of(slot, gpu_ids),
    )


def accelerator_of(slot: Slot, gpu_ids: tuple[int, ...]) -> str | None:
    """The name of the slot's GPUs as discovery gave it ("NVIDIA H100 80GB HBM3", "sim");
    ``A + B`` for a slot of GPUs of two models; None where discovery named none of them."""
    known = {g.index: g.name for g in slot.devices}
    names = list(dict.fromkeys(known[i] for i in gpu_ids if i in known))
    return " + ".join(names) if names else None


STALE_SLACK_SECONDS = 1.0  # filesystem clocks may lag time.time() a little


def completion_path(paths: RunPaths, task: TaskSpec, values: dict[str, str]) -> Path | None:
    """Where the attempt's completion file must appear (None: the task has none)."""
    if not task.done_when:
        return None
    return paths.task_dir(task.id) / render(task.done_when, values)


def set_aside_stale(
    paths: RunPaths, task: TaskSpec, values: dict[str, str], n: int
) -> tuple[Path, Path] | None:
    """Move whatever is at the completion path before attempt ``n`` starts aside, to
    ``<workspace>/stale/attempt-<n>-<name>`` (not into ``attempt-<n>/``: the launch makes that
    folder afresh): only a file this attempt writes may count, and nothing of the task's is
    deleted. Returns (from, to) when something was moved."""
    if not task.done_when:
        return None
    workspace = paths.task_dir(task.id)
    rel = PurePosixPath(render(task.done_when, values))
    # the folder resolved (it must stay in the workspace), the file itself not: a symlink the
    # task planted there is moved, never what it points to
    target = inside(workspace, str(rel.parent)) / rel.name
    if not os.path.lexists(target):
        return None
    folder = workspace / "stale"
    if folder.is_symlink():
        folder.unlink()  # planted: never followed
    folder.mkdir(exist_ok=True)
    dest = folder / f"attempt-{n}-{target.name}"
    k = 2
    while os.path.lexists(dest):
        dest = folder / f"attempt-{n}-{k}-{target.name}"
        k += 1
    os.rename(target, dest)
    return target, dest


def judge(
    paths: RunPaths,
    task: TaskSpec,
    end: AttemptEnd,
    values: dict[str, str],
    record: AttemptRecord,
    data: dict[str, Any],
    *,
    base_dir: Path | None = None,
) -> Outcome:
    """Done = exit 0 and the completion file (if any) parses and was written by this attempt
    (see :func:`check_written`); its result lands in ``data``. ``base_dir``: where a task
    without ``cwd`` runs (its source folder, unless a glob matched it one)."""
    record = record.but(metrics=parse_metrics(paths.attempt_log(task.id, record.n), task.metrics))
    if task.usage is not None:  # an agent's tokens and cost (issue 34)
        record = record.but(**usage_fields(paths.attempt_log(task.id, record.n), task.usage))
        over = over_max_usd(task.max_usd, record.cost_usd)
        if over is not None:
            return Outcome(State.FAILED, over, record.but(reason=over), final=True)
    if skipped(task, end):
        reason = f"skipped (exit {end.returncode} = skip_exit_code)"
        return Outcome(State.SKIPPED, reason, record.but(reason=reason))
    if not end.ok:
        return Outcome(State.FAILED, end.reason, record)
    if task.done_when:
        workspace = paths.task_dir(task.id)
        rel = render(task.done_when, values)
        try:  # the task's own file: any problem with it fails this attempt, never the run
            result = flatten(read_completion(workspace, rel))
            target = inside(workspace, rel)
            _written_since(target, end.started)
            check_written(target, rel, source_folders(task, values, base_dir, workspace))
        except ResultFileError as exc:
            reason = f"exit 0 but {exc}"
            return Outcome(State.FAILED, reason, record.but(reason=reason))
        data["result"] = result
    return Outcome(State.DONE, end.reason, record)


def skipped(task: TaskSpec, end: AttemptEnd) -> bool:
    """The task declared this end a skip (``skip_exit_code``): not a failure, not a success."""
    return (
        task.skip_exit_code is not None
        and end.kind is EndKind.EXITED
        and end.returncode == task.skip_exit_code
    )


def source_folders(
    task: TaskSpec, values: dict[str, str], base_dir: Path | None, workspace: Path
) -> list[Path]:
    """The folders a task's files may be copied from: its glob match's folder (``task_dir``)
    and the ``cwd`` it sets; a task that no glob matched: its working folder (``cwd``, or
    ``base_dir``). None inside the workspace itself (a task that runs in its workspace writes
    its result there)."""
    found = [Path(task.vars["task_dir"])] if "task_dir" in task.vars else []
    if task.cwd is not None or (base_dir is not None and not found):
        found.append(render_cwd(task, values, base_dir or workspace))
    home = Path(os.path.realpath(workspace))
    out: list[Path] = []
    for folder in found:
        real = Path(os.path.realpath(folder))
        if real != home and home not in real.parents and real not in out:
            out.append(real)
    return out


def check_written(target: Path, rel: str, sources: list[Path]) -> None:
    """ResultFileError when the completion file ``target`` (``rel`` in the workspace) is
    byte-identical to the file at ``rel`` in one of the task's source folders: a copy of the
    one the task folder ships (``cp -r {task_dir}/. {workspace}/`` gives it a new time), not
    written by this attempt. Sizes are compared first; nothing on the source side is followed
    (:func:`open_beneath`); a source file that cannot be read is no copy."""
    try:
        mine = open_regular(target)
    except OSError:
        return  # it parsed a moment ago; a task that removes it now is judged by what was read
    try:
        for folder in sources:
            try:
                theirs = open_beneath(folder, rel)
            except OSError:
                continue
            try:
                same = same_bytes(mine, theirs, RESULT_MAX_BYTES)
            finally:
                os.close(theirs)
            if same:
                raise ResultFileError(  # one text for every task: summary.json groups it
                    f"completion file {rel} was not written by this attempt (it is "
                    "byte-identical to the one in the task's source folder: a copy)"
                )
    finally:
        os.close(mine)


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
