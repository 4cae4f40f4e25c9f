"""An attempt whose supervisor is gone, judged by what it left (resume and reclaim).

The exit status of such an orphan cannot be known; its completion file, written after the claim
and not a copy of the one its source folder ships, makes it done (attempt ``kind: orphan``).
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import ValidationError

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.errors import GpuswarmError
from gpuswarm.core.events import Ev
from gpuswarm.core.metrics import ResultFileError, flatten, parse_metrics, read_completion
from gpuswarm.core.models import AttemptRecord, Lease, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.placeholders import render
from gpuswarm.core.taskfiles import inside
from gpuswarm.exec.plan import STALE_SLACK_SECONDS, check_written, source_folders
from gpuswarm.store.leases import slot_label
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import Claimed, DirQueue
from gpuswarm.store.runs import open_record


def _lease_time(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def judge_orphan(queue: DirQueue, ledger: Ledger, claimed: Claimed, why: str) -> bool:
    """Judge the attempt of a task whose supervisor is gone by what it left, as resume would
    judge any attempt: nothing of it runs any more (the caller checked) and its completion file,
    written after the claim (the running file's time), parses: then it is done, not re-run.
    The exit status of an orphan cannot be known, so a task without ``done_when`` is re-run.
    """
    desc = claimed.desc
    try:
        task = TaskSpec.model_validate(desc.task)
    except ValidationError:
        return False
    claimed_at = _lease_time(claimed.path)
    if task.done_when is None or claimed_at is None:
        return False
    paths = queue.paths
    n = desc.next_attempt
    values = {
        **task.vars,
        "workspace": str(paths.task_dir(task.id)),
        "run_dir": str(paths.root),
        "task_id": task.id,
        "name": task.name,
        "attempt": str(n),
    }
    rel = render(task.done_when, values)
    if "{" in rel:
        return False  # it names the slot or GPU, which the journal would have to tell
    workspace = paths.task_dir(task.id)
    try:
        target = inside(workspace, rel)  # never outside the workspace (a planted symlink)
        written = target.stat().st_mtime
        result = flatten(read_completion(workspace, rel))
        # a copy of the file the task folder ships is no more this attempt's than an old one
        check_written(target, rel, source_folders(task, values, _base_dir(paths), workspace))
    except (OSError, ResultFileError):
        return False
    if written < claimed_at - STALE_SLACK_SECONDS:
        return False  # older than the claim: not this attempt's
    lease = Lease.parse(claimed.path.name)
    stamp = time.strftime("%H:%M:%S", time.localtime(written))
    reason = f"finished after {why}: {target.name} written at {stamp} parses (exit status unknown)"
    slot = slot_label(queue.paths, lease.owner, lease.slot) if lease and not lease.reclaimer else ""
    record = AttemptRecord.orphan(n=n, slot=slot, started=claimed_at, ended=written, reason=reason)
    # the log is whole: the dead supervisor's keeper moved what the task printed after its death
    # (exec/local/keeper.py; the caller ended the attempts and waited for it)
    metrics = parse_metrics(paths.attempt_log(task.id, n), task.metrics)
    desc.add_attempt(record.but(metrics=metrics) if metrics else record)
    desc.result = result
    desc.reason = None
    queue.move(
        claimed,
        State.DONE,
        lambda: ledger.emit(
            Ev.FINISHED,
            task=claimed.task_id,
            attempt=n,
            slot="",
            state="done",
            reason=reason,
            seconds=round(max(0.0, written - claimed_at), 3),
            retry=False,
            judged=True,
        ),
    )
    return True


def _base_dir(paths: RunPaths) -> Path:
    """Where the run's tasks without ``cwd`` run (run.json's ``base_dir``, as resume uses it)."""
    try:
        _, info = open_record(paths.root)
    except GpuswarmError:
        return Path()
    return Path(info.base_dir)
