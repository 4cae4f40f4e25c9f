"""What ``status`` (and its JSON) shows of a run's Slurm side (issue 36): the worker jobs a
login-node run submitted (``slurm/jobs.json``: id, state, nodes) and the allocation a run inside
one ran in (``slurm/allocation.json``: job, nodes, the nodes with a worker, its end)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, cast

from typing_extensions import NotRequired

from gpuswarm.core.fsutil import read_json

MAX_BYTES = 1 << 20  # files gpuswarm wrote itself; larger ones are not read
MAX_JOBS_SHOWN = 50


class SlurmJob(TypedDict):
    """A worker job as ``slurm/jobs.json`` lists it (its values as the file has them)."""

    job: Any
    state: Any
    nodes: Any
    reason: Any


class JobRecord(TypedDict):
    """A worker job as the login-node driver writes it into ``slurm/jobs.json`` (and
    summary.json's ``slurm_jobs``)."""

    job: str
    state: str  # SUBMITTED, then Slurm's (PENDING, RUNNING, COMPLETED, ...)
    nodes: str
    active: bool
    submitted: float
    reason: str
    ended: NotRequired[float]


class Allocation(TypedDict, total=False):
    """``slurm/allocation.json``: the allocation a run inside one ran in, as its head wrote it
    (``exec/slurm/session.py``)."""

    job: str
    nodes: list[str]
    head: str  # the node the supervisor ran on
    workers: list[str]  # the nodes it started a worker on
    ends_at: float | None  # epoch seconds (None: no time limit)


class SlurmView(TypedDict):
    jobs: list[SlurmJob]  # the last MAX_JOBS_SHOWN
    allocation: Allocation | None  # slurm/allocation.json, as it is


def _read(path: Path) -> object:
    """The JSON object in ``path``; None when it is absent, unreadable, too large or no
    object."""
    with contextlib.suppress(OSError, ValueError):
        if path.is_file() and path.stat().st_size <= MAX_BYTES:
            data = read_json(path)
            return data if isinstance(data, dict) else None
    return None


def slurm_view(root: Path) -> SlurmView | None:
    """None for a run that never ran under Slurm."""
    folder = root / "slurm"
    jobs = _read(folder / "jobs.json")
    alloc = _read(folder / "allocation.json")
    if jobs is None and alloc is None:
        return None
    found = jobs.get("jobs", []) if isinstance(jobs, dict) else []
    listed = [j for j in found if isinstance(j, dict)]
    shown: list[SlurmJob] = [
        {
            "job": j.get("job"),
            "state": j.get("state"),
            "nodes": j.get("nodes"),
            "reason": j.get("reason"),
        }
        for j in listed[-MAX_JOBS_SHOWN:]
    ]
    return {"jobs": shown, "allocation": cast(Allocation | None, alloc)}


def slurm_lines(view: SlurmView | None) -> list[str]:
    """The view as plain lines for the terminal."""
    if not view:
        return []
    lines = []
    alloc = view.get("allocation") or {}
    if alloc:
        workers = ", ".join(alloc.get("workers") or []) or "none"
        lines.append(
            f"slurm allocation {alloc.get('job')}: nodes {', '.join(alloc.get('nodes') or [])} "
            f"(head on {alloc.get('head')}; workers on {workers})"
        )
    for job in view.get("jobs") or []:
        where = f" on {job['nodes']}" if job.get("nodes") else ""
        lines.append(f"slurm job {job.get('job')}: {str(job.get('state')).lower()}{where}")
    return lines


def slurm_section(root: Path, esc: Callable[[object], str]) -> str:
    """report.html's Slurm section (empty for a run that never ran under Slurm)."""
    lines = slurm_lines(slurm_view(root))
    if not lines:
        return ""
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    return f"<h2>Slurm</h2>\n<ul>{items}</ul>\n"
