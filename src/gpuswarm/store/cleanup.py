"""Removing whole run folders (``gpuswarm clean``), never a live one.

A run is first renamed to a hidden ``.<name>.removing-<pid>`` beside it (one rename: from then on
it is no run to any command, even if the removal is cut short), then deleted. A run folder that
is a symbolic link is never renamed (nor is anything through one deleted). The liveness check
is made right before the rename, holding the run's init lock (a supervisor attaching waits for
it): no supervisor holds the ``live`` lock and no owner shows a heartbeat.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from gpuswarm.core.fsutil import fsync_dir, pid_alive
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.leases import FileLock, is_live, owner_alive

REMOVING = ".removing-"
DEFAULT_LEASE_TTL = 30.0
LINKED = "it is a symbolic link (never followed: clean removes only real run folders)"


def in_use(paths: RunPaths, lease_ttl: float = DEFAULT_LEASE_TTL) -> bool:
    """Whether a supervisor may be on the run: one holds its ``live`` lock, or an owner file
    shows a live owner (on this host its process, elsewhere a heartbeat within ``lease_ttl``;
    an owner file is removed when its supervisor ends)."""
    if is_live(paths):
        return True
    try:
        owners = [p.name for p in paths.owners.iterdir() if not p.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(owner_alive(paths, name.replace("_", ":"), lease_ttl) for name in owners)


def removing_name(run: Path) -> Path:
    return run.parent / f".{run.name}{REMOVING}{os.getpid()}"


def remove_run(
    paths: RunPaths,
    lease_ttl: float = DEFAULT_LEASE_TTL,
    keep: Callable[[], str | None] | None = None,
) -> str | None:
    """Remove the run folder unless a supervisor may be on it (or ``keep``, asked under the
    lock, says why not); None when removed, else why not."""
    if paths.root.is_symlink():  # before its lock: that file would be made through the link
        return LINKED
    lock = FileLock(paths.lock)
    try:
        if not lock.acquire(exclusive=True):
            return "a supervisor is initialising it"
    except OSError as exc:
        return f"its lock cannot be taken ({exc.strerror})"
    try:
        if in_use(paths, lease_ttl):
            return "it is live"
        why = keep() if keep is not None else None
        if why is not None:
            return why
        hidden = removing_name(paths.root)
        os.rename(paths.root, hidden)
        if hidden.is_symlink():  # replaced by a link since the look: put back, untouched
            os.rename(hidden, paths.root)
            return LINKED
    except OSError as exc:
        return f"it cannot be renamed away ({exc.strerror})"
    finally:
        lock.release()
    fsync_dir(hidden.parent)
    shutil.rmtree(hidden, ignore_errors=True)
    return None


def half_removed(parent: Path) -> list[Path]:
    """Run folders under ``parent`` whose removal was cut short (its remover is gone)."""
    try:
        entries = [p for p in parent.iterdir() if p.name.startswith(".") and REMOVING in p.name]
    except OSError:
        return []
    out = []
    for entry in entries:
        pid = entry.name.rsplit(REMOVING, 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)) and entry.is_dir() and not entry.is_symlink():
            out.append(entry)
    return out


def finish_removal(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
