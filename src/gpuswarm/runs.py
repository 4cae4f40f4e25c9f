"""Creating, opening, locking and recovering run directories.

A run is staged in a hidden sibling folder and made visible by one rename once every descriptor
and run.json are on disk, so a bad input or a crash during creation never leaves half a run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from gpuswarm import __version__
from gpuswarm.errors import QueueError, RunDirError, RunLockedError
from gpuswarm.fsutil import atomic_write_json, fsync_dir, read_json
from gpuswarm.ledger import Ev, Ledger
from gpuswarm.paths import RunPaths, find_runs, run_dir_name, slugify
from gpuswarm.process import find_by_env, kill_tree
from gpuswarm.queue import DirQueue, State, base_name, lease_of, new_descriptor, sync_tree


def owner_id() -> str:
    """``host:pid:start``: names this supervisor process uniquely, even after pid reuse."""
    start = int(psutil.Process().create_time() * 100)
    return f"{slugify(socket.gethostname(), 60)}:{os.getpid()}:{start}"


@dataclass(frozen=True)
class NewRun:
    name: str
    workspace: Path
    info: dict[str, Any]  # the run.json content, secrets already redacted
    tasks: list[dict[str, Any]]  # TaskSpec dumps, in submission order


def create_run(new: NewRun, *, suffix: str | None = None, now: datetime | None = None) -> RunPaths:
    """Stage the run (descriptors, run.json), sync once, then rename it into place."""
    parent = new.workspace / slugify(new.name)
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(parent)
    now = now or datetime.now()
    final = _free_name(parent, run_dir_name(now, suffix))
    staging = RunPaths(parent / f".staging-{final.name}-{os.getpid()}")
    staging.root.mkdir(mode=0o755)
    try:
        DirQueue.create_layout(staging)
        staging.tasks.mkdir()
        descriptors = (new_descriptor(t, seq) for seq, t in enumerate(new.tasks))
        DirQueue.write_pending(staging, descriptors)
        info = {**new.info, "run_dir": final.name, "created": now.isoformat(timespec="seconds")}
        atomic_write_json(staging.run_json, info, durable=False)
        staging.events.touch()
        sync_tree(staging.root)
        os.rename(staging.root, final)
        fsync_dir(parent)
    except BaseException:
        _remove_tree(staging.root)
        raise
    paths = RunPaths(final)
    ledger = Ledger(paths.events)
    ledger.emit(Ev.RUN_CREATED, tasks=len(new.tasks), name=new.name, version=__version__)
    ledger.close()
    return paths


def _remove_stale_staging(parent: Path) -> None:
    """Remove staging folders whose creator died (SIGKILL mid-creation): never a visible run."""
    for entry in parent.glob(".staging-run_*"):
        pid = entry.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            _remove_tree(entry)


def _free_name(parent: Path, name: str) -> Path:
    candidate = parent / name
    n = 2
    while candidate.exists():
        candidate = parent / f"{name}-{n}"
        n += 1
    return candidate


def _remove_tree(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)


def open_run(run_dir: Path) -> tuple[RunPaths, dict[str, Any]]:
    """The run's paths and its run.json, or RunDirError naming what is wrong."""
    paths = RunPaths(run_dir.resolve()).require_run()
    try:
        info = read_json(paths.run_json)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{paths.run_json}: unreadable run snapshot ({exc})") from None
    if not isinstance(info, dict):
        raise RunDirError(f"{paths.run_json}: not a JSON object")
    return paths, info


def latest_run(workspace: Path, name: str | None = None) -> Path:
    runs = find_runs(workspace)
    if name is not None:
        runs = [r for r in runs if r.parent.name == slugify(name)]
    if not runs:
        what = f"named {name!r} " if name else ""
        raise RunDirError(
            f"no run {what}found under {workspace}; pass the run folder, or --workspace"
        )
    return max(runs, key=lambda r: (r.name, r.stat().st_mtime))


class RunLock:
    """An exclusive ``flock`` on ``.parallel/lock``, held for a supervisor's lifetime.

    The kernel drops it when the holder dies (even by SIGKILL), so a stale lock cannot block a
    resume. The holder writes its owner id into the file for the error message.
    """

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self._fd: int | None = None

    def acquire(self, owner: str) -> None:
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunLockedError(
                    f"{self.paths.root} is live: its supervisor {holder} is running; "
                    f"watch it with 'gpuswarm status {self.paths.root}' or stop it first"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{owner}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def is_held_elsewhere(self) -> bool:
        try:
            fd = os.open(self.paths.lock, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False


@contextlib.contextmanager
def locked(paths: RunPaths, owner: str) -> Iterator[RunLock]:
    lock = RunLock(paths)
    lock.acquire(owner)
    try:
        yield lock
    finally:
        lock.release()


def recover(
    queue: DirQueue, ledger: Ledger, *, retry_failed: bool, grace: float = 10.0
) -> dict[str, int]:
    """Repair a run no supervisor holds: after a crash, a stop, or to retry failures.

    Call only while holding the run lock: then no supervisor is live and every running
    descriptor was orphaned. First the attempts a crashed supervisor left running are killed
    (they run on in their own sessions and would hold their GPU twice); then each running
    descriptor either completes the move its supervisor had begun (done/failed), or goes back
    to pending/ with an interrupted attempt recorded, so the re-run gets a new attempt number.
    Unless ``retry_failed`` is False, failed tasks are re-queued with a fresh attempt budget.
    """
    moved = {"killed": 0, "interrupted": 0, "recovered": 0, "retried": 0, "corrupt": 0}
    leftovers = find_by_env("GPUSWARM_RUN_DIR", str(queue.paths.root))
    if leftovers:
        moved["killed"] = kill_tree(leftovers, grace)
        ledger.emit(Ev.KILLED, pids=leftovers, reason="attempts of a crashed supervisor")
    for name in queue.names(State.RUNNING):
        moved[_recover_running(queue, ledger, name)] += 1
    if retry_failed:
        for name in queue.names(State.FAILED):
            moved["retried"] += _retry_failed(queue, ledger, name)
    return moved


def _recover_running(queue: DirQueue, ledger: Ledger, name: str) -> str:
    try:
        claimed = queue.adopt_running(name)
    except QueueError:
        queue.quarantine(queue.paths.state_dir("running") / name, "unreadable")
        ledger.emit(Ev.CORRUPT, file=name, reason="unreadable running descriptor")
        return "corrupt"
    data = claimed.data
    target = data.get("state")
    if target in (State.DONE.value, State.FAILED.value):
        queue.move(claimed, State(target))
        ledger.emit(Ev.RECOVERED, task=claimed.task_id, state=target)
        return "recovered"
    lease = lease_of(name)
    data["attempts"].append(
        {
            "n": len(data["attempts"]) + 1,
            "slot": f"slot {lease[1]}" if lease else "",
            "interrupted": True,
            "kind": "lost",
            "reason": "its supervisor died" + (f" ({lease[0]})" if lease else ""),
        }
    )
    data["interruptions"] = data.get("interruptions", 0) + 1
    queue.move(claimed, State.PENDING)
    ledger.emit(Ev.REQUEUED, task=claimed.task_id, reason="interrupted", frm="running")
    return "interrupted"


def _retry_failed(queue: DirQueue, ledger: Ledger, name: str) -> int:
    src = queue.paths.state_dir("failed") / name
    data = queue.read(State.FAILED, name)
    if data is None:
        queue.quarantine(src, "unreadable")
        ledger.emit(Ev.CORRUPT, file=name, reason="unreadable failed descriptor")
        return 0
    data["budget_from"] = len(data.get("attempts", []))
    data["reason"] = None
    data["state"] = State.PENDING.value
    staged = queue.paths.state_dir("failed") / f".retry-{base_name(name)}"
    atomic_write_json(staged, data, durable=queue.durable)
    os.replace(staged, src)
    os.rename(src, queue.paths.state_dir("pending") / name)
    queue.push(name)
    ledger.emit(Ev.REQUEUED, task=data.get("id"), reason="resume-retry", frm="failed")
    return 1


def write_owner_file(paths: RunPaths, owner: str, detail: dict[str, Any]) -> Path:
    owners = paths.parallel / "owners"
    owners.mkdir(exist_ok=True)
    path = owners / owner.replace(":", "_")
    atomic_write_json(path, {"owner": owner, "since": time.time(), **detail})
    return path
