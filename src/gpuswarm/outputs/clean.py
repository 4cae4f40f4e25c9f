"""``gpuswarm clean``: which runs of a workspace are finished and idle for longer than a given
time, how much disk each takes, and their removal (:func:`gpuswarm.store.cleanup.remove_run`:
never a live run, checked right before each removal).

Finished: no supervisor on it and nothing in running/: complete, finished with failures,
stopped (Ctrl-C) or unfinished. A crashed run (its supervisor died: tasks left in running/, or no
summary) is kept: ``status`` and ``resume`` are what it needs. Last activity: the newest of
summary.json's and events.jsonl's modification times (run.json's when it has neither).

Only real folders inside the workspace it was given are removed: a run that is a symbolic link,
or that is reached through one (a name folder linked elsewhere), is reported as kept, never
renamed, measured or removed (:func:`outside_reason`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from typing_extensions import NotRequired

from gpuswarm.core.errors import RunDirError
from gpuswarm.core.paths import RunPaths
from gpuswarm.outputs.aggregate import COMPLETE, STOPPED, UNFINISHED, WITH_FAILURES
from gpuswarm.outputs.status import list_runs
from gpuswarm.store.cleanup import (
    DEFAULT_LEASE_TTL,
    finish_removal,
    half_removed,
    in_use,
    remove_run,
)
from gpuswarm.store.runinfo import read_record

FINISHED = (COMPLETE, WITH_FAILURES, STOPPED, UNFINISHED)


class CandidateJson(TypedDict):
    """``clean --json``'s entry of one run."""

    run: str
    state: str
    age_s: float
    bytes: int
    removed: bool
    kept_because: NotRequired[str]


@dataclass
class Candidate:
    """A finished run idle for long enough, and what became of it."""

    run: Path
    state: str
    age_s: float
    bytes: int
    removed: bool = False
    kept_because: str | None = None

    def as_json(self) -> CandidateJson:
        out: CandidateJson = {
            "run": str(self.run),
            "state": self.state,
            "age_s": round(self.age_s, 1),
            "bytes": self.bytes,
            "removed": self.removed,
        }
        if self.kept_because:
            out["kept_because"] = self.kept_because
        return out


def last_activity(paths: RunPaths) -> float:
    """The newest modification time of summary.json and events.jsonl (run.json's without)."""
    times = []
    for path in (paths.summary_json, paths.events):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    if not times:
        try:
            times.append(paths.run_json.stat().st_mtime)
        except OSError:
            return time.time()  # unreadable: as young as can be (kept)
    return max(times)


def disk_bytes(root: Path) -> int:
    """What the folder takes on disk (allocated blocks, each inode once, symlinks not followed)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return total


def lease_ttl(paths: RunPaths) -> float:
    """The run's lease_ttl (how old an owner's heartbeat may be), from run.json."""
    try:
        return float(read_record(paths.run_json).settings.get("lease_ttl", DEFAULT_LEASE_TTL))
    except (RunDirError, ValueError, TypeError):
        return DEFAULT_LEASE_TTL


def outside_reason(run: Path, workspace: Path) -> str | None:
    """Why ``run`` (as listed under ``workspace``) is no real folder inside it: a symbolic link
    on the way from the workspace (the run itself or its name folder), or a path that leaves
    it. None when clean may remove it."""
    try:
        rel = run.relative_to(workspace)
    except ValueError:
        return f"it is not inside the workspace {workspace}"
    path = workspace
    for part in rel.parts:
        path = path / part
        if path.is_symlink():
            return (
                f"{path} is a symbolic link: clean never follows one, nor removes anything "
                f"outside {workspace}"
            )
    if not run.resolve().is_relative_to(workspace.resolve()):
        return f"it is not inside the workspace {workspace}"
    return None


def find_candidates(
    workspace: Path, older_than: float, now: float | None = None
) -> list[Candidate]:
    """The finished runs under ``workspace`` idle for longer than ``older_than`` seconds, oldest
    activity first."""
    now = time.time() if now is None else now
    out = []
    for row in list_runs(workspace):
        if row["live"] or row["state"] not in FINISHED or row["counts"].get("running"):
            continue
        paths = RunPaths(Path(row["run"]))
        age = now - last_activity(paths)
        if age <= older_than or in_use(paths, lease_ttl(paths)):
            continue
        why = outside_reason(paths.root, workspace)
        size = disk_bytes(paths.root) if why is None else 0  # never measured through a link
        out.append(Candidate(paths.root, row["state"], age, size, kept_because=why))
    return sorted(out, key=lambda c: (-c.age_s, str(c.run)))


def remove_candidates(candidates: list[Candidate], older_than: float) -> None:
    """Remove each candidate unless a supervisor came to it meanwhile or it was active since it
    was found (``kept_because``)."""
    for cand in candidates:
        if cand.kept_because is not None:  # a link, or outside the workspace: never touched
            continue
        paths = RunPaths(cand.run)

        def active(paths: RunPaths = paths) -> str | None:
            idle = time.time() - last_activity(paths)
            return None if idle > older_than else "it was active again meanwhile"

        why = remove_run(paths, lease_ttl(paths), keep=active)
        cand.removed = why is None
        cand.kept_because = why


def finish_half_removed(workspace: Path) -> list[Path]:
    """Delete what earlier removals left when they were cut short (never a run: hidden names)."""
    if not workspace.is_dir():
        return []
    names = [
        p
        for p in workspace.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
    ]
    done = []
    for parent in (workspace, *names):
        for folder in half_removed(parent):
            finish_removal(folder)
            done.append(folder)
    return done
