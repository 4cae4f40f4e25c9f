"""The user's runs, wherever they are: a per-user index that ``ls``, ``status``, ``resume
--latest`` and ``dashboard`` read when ``./runs`` does not hold the run (a config's runs go
under the config's folder).

The index is a folder under the user's state directory (``$GPUSWARM_STATE_DIR``, else
``$XDG_STATE_HOME/gpuswarm``, else ``~/.local/state/gpuswarm``): ``runs/`` with one small
JSON file per run, named by a hash of the run's path, written (temp + fsync + rename) when the
run is created. One file per run: writers never share a file, so concurrent runs need no lock,
and a torn write is a temp file nobody reads. Private (folders 0700, files 0600). Bounded:
reading it drops the entries whose run folder is gone, and writing keeps the newest
:data:`MAX_ENTRIES`. The index only points at runs; a run folder stays the whole truth, so an
index that cannot be written (a read-only home) never fails a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.errors import RunDirError
from gpuswarm.core.fsutil import atomic_write_bytes, dumps
from gpuswarm.core.paths import RUN_PREFIX, RunPaths, find_runs, resolve_run_dir, slugify
from gpuswarm.store.runinfo import RunRecord

STATE_ENV = "GPUSWARM_STATE_DIR"
MAX_ENTRIES = 500
MAX_ENTRY_BYTES = 64 << 10  # an entry is a path and a name: anything bigger is not ours
RECENT = 5  # runs a "not found" message lists


def state_dir() -> Path:
    """The user's gpuswarm state folder (not created here)."""
    override = os.environ.get(STATE_ENV)
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "gpuswarm"


def index_dir() -> Path:
    return state_dir() / "runs"


@dataclass(frozen=True)
class Entry:
    path: Path
    name: str
    created: float
    file: Path


def _key(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:24]


def record(run: Path, name: str) -> None:
    """Add the run at ``run`` (an absolute run folder) to the index; never raises."""
    with contextlib.suppress(OSError):
        folder = index_dir()
        folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder.mkdir(exist_ok=True, mode=0o700)
        entry = {"path": str(run), "name": name, "created": time.time()}
        atomic_write_bytes(folder / f"{_key(run)}.json", dumps(entry), mode=0o600)
        _cap(folder)


def remember(run: Path, name: str) -> None:
    """:func:`record` unless the index has the run: a run made before the index existed, or
    on another host (``work``), is found from anywhere once resumed or joined here; one it
    has keeps its creation time (the newest run stays the newest made)."""
    with contextlib.suppress(OSError):
        if (index_dir() / f"{_key(run)}.json").exists():
            return
    record(run, name)


def forget(run: Path) -> None:
    """Drop the entry of the run at ``run`` (it moved: a research experiment's queue is
    created in the experiment's staging folder); never raises."""
    with contextlib.suppress(OSError):
        (index_dir() / f"{_key(run)}.json").unlink()


def _cap(folder: Path) -> None:
    if len(os.listdir(folder)) <= MAX_ENTRIES:
        return
    entries = _read(folder)
    for old in entries[: max(0, len(entries) - MAX_ENTRIES)]:
        with contextlib.suppress(OSError):
            old.file.unlink()


def _read(folder: Path) -> list[Entry]:
    """The index's entries, oldest first (unreadable ones skipped)."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(".")]
    except OSError:
        return []
    out = []
    for name in names:
        file = folder / name
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as fh:
                data = json.loads(fh.read(MAX_ENTRY_BYTES + 1)[:MAX_ENTRY_BYTES])
            out.append(Entry(Path(data["path"]), str(data["name"]), float(data["created"]), file))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda e: e.created)


def indexed_runs() -> list[Path]:
    """The runs the index knows whose folder is still a run, oldest first; the entries of
    runs that are gone (removed, ``gpuswarm clean``) are pruned."""
    found = []
    for entry in _read(index_dir()):
        if entry.path.is_absolute() and RunPaths(entry.path).is_run():
            found.append(entry.path)
        else:
            with contextlib.suppress(OSError):
                entry.file.unlink()
    return found


def newest_first(runs: list[Path]) -> list[Path]:
    """``runs`` without duplicates, newest first (by folder name: run_<stamp>, then mtime)."""
    unique = {r.resolve(): None for r in runs}

    def key(run: Path) -> tuple[str, float]:
        try:
            return run.name, run.stat().st_mtime
        except OSError:
            return run.name, 0.0

    return sorted(unique, key=key, reverse=True)


def known_runs(workspace: Path) -> list[Path]:
    """The runs under ``workspace`` and the indexed ones, newest first."""
    return newest_first([*find_runs(workspace), *indexed_runs()])


def recent_lines(workspace: Path, limit: int = RECENT) -> str:
    """The newest runs, one per line (for a "not found" message), or a hint when none."""
    runs = known_runs(workspace)[:limit]
    if not runs:
        return f"no run is under {workspace} or recorded in {index_dir()}"
    return "recent runs:\n" + "\n".join(f"  {run}" for run in runs)


def batch_workspaces(limit: int = 5) -> list[Path]:
    """The workspaces (``<workspace>/<name>/run_*``) of the indexed runs, newest first, each
    once; an experiment's queue run is research's (never one to clean), left out."""
    found: list[Path] = []
    for run in newest_first(indexed_runs()):
        if run.parent.parent not in found and ".gpuswarm" not in run.parts:
            found.append(run.parent.parent)
    return found[:limit]


def is_research(run: Path) -> bool:
    """Whether ``run`` is a research experiment's queue run (its loop's runner serves it)."""
    try:
        with RunPaths(run).run_json.open("rb") as fh:
            return RunRecord.from_json(json.loads(fh.read(MAX_ENTRY_BYTES))).source == "research"
    except (OSError, ValueError, RunDirError):
        return False


def newest_run(workspace: Path, name: str | None = None, *, batch: bool = False) -> Path:
    """The newest run under ``workspace`` or in the index (of ``name`` when given); ``batch``
    (``resume --latest``): no research experiment's run unless ``name`` names it (``resume``
    runs its tasks outside the loop that judges them)."""
    runs = known_runs(workspace)
    if name is not None:
        runs = [r for r in runs if r.parent.name == slugify(name)]
    found = next((r for r in runs if name is not None or not batch or not is_research(r)), None)
    if found is None:
        what = f"named {name!r} " if name else ""
        loops = " (a research experiment's run goes on with gpuswarm research loop)"
        raise RunDirError(
            f"no run {what}found under {workspace} or in the index of your runs "
            f"({index_dir()}); pass a run folder" + (loops if runs else "")
        )
    return found


def resolve(arg: Path, workspace: Path = Path("runs")) -> Path:
    """The run folder meant by ``arg``: a run folder or a path inside one, a bare run name
    (``run_20260702_041903``) or a run's name (``sweep``: its newest run), looked up under
    ``workspace`` first, then in the index. A name that matches nothing: RunDirError listing
    the recent runs."""
    if len(arg.parts) != 1:
        return resolve_run_dir(arg, workspace)
    if arg.exists():  # a folder of that name that is no run (a config's folder: `sweep`)
        here = resolve_run_dir(arg, workspace)
        if RunPaths(here).is_run():
            return here
        named = [r for r in known_runs(workspace) if r.parent.name == slugify(arg.name)]
        return named[0] if named else here
    if arg.name.startswith(RUN_PREFIX):
        with contextlib.suppress(RunDirError):
            return resolve_run_dir(arg, workspace)
        found = [r for r in indexed_runs() if r.name == arg.name]
        if len(found) > 1:
            listed = ", ".join(str(r) for r in found)
            raise RunDirError(f"{arg.name} names several runs ({listed}); pass the run folder")
    else:
        found = [r for r in known_runs(workspace) if r.parent.name == slugify(arg.name)][:1]
    if found:
        return found[0]
    raise RunDirError(
        f"{arg}: no such run folder, and no run of that name under {workspace} or in the "
        f"index of your runs; pass the run folder.\n{recent_lines(workspace)}"
    )
