"""One run per GPU at a time on a host: per-GPU lock files that live supervisors hold.

Each supervisor holds, for every GPU of its slots, a file
``<lock dir>/<vendor>-<id>/<pid>-<n>.json`` (its run folder inside) under an exclusive
``flock`` for as long as it runs: the kernel drops the lock when the process dies, so a
crashed run never blocks a GPU. Before a run starts, the files of its GPUs are checked (under
a guard flock, so two runs starting at once see each other): one held by a process of
*another* run refuses the start with a message naming that run, unless ``--share-gpus`` is
given. Supervisors of the same run (``work``, ``resume``) never block each other. Files whose
lock is free are leftovers and are removed.

The lock dir is per user: ``$GPUSWARM_LOCK_DIR``, else ``$XDG_RUNTIME_DIR/gpuswarm/gpu-locks``,
else ``<temp dir>/gpuswarm-<uid>/gpu-locks`` (mode 0700, refused when another user owns it), so it
works without root; runs of other users are not seen. Simulated GPUs (``sim:N``) are no shared
device: two demos, test suites or research experiments on ``sim:4`` at once must not refuse each
other, so they are locked (``sim-0``...) only inside an explicit ``$GPUSWARM_LOCK_DIR`` (which is
how the lock itself is tested without a GPU).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from gpuswarm.core.errors import GpuBusyError

_SEQ = itertools.count(1)


def lock_dir() -> Path | None:
    """The per-user lock folder (made if needed); None when no safe one can be had."""
    override = os.environ.get("GPUSWARM_LOCK_DIR")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if override:
        base = Path(override)
    elif xdg and Path(xdg).is_dir() and os.access(xdg, os.W_OK):
        base = Path(xdg) / "gpuswarm"
    else:
        base = Path(tempfile.gettempdir()) / f"gpuswarm-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(base)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return None  # a symlink or someone else's folder: never trust it
        folder = base / "gpu-locks"
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return folder


def gpu_keys(vendor: str, ids: Iterable[int]) -> list[str]:
    """The lock names of these GPUs; none for simulated ones unless a lock dir is explicit."""
    if vendor == "sim" and not os.environ.get("GPUSWARM_LOCK_DIR"):
        return []
    return sorted({f"{vendor}-{i}" for i in ids})


def held_by(path: Path) -> dict[str, object] | None:
    """The holder's record when a live process holds ``path`` ({} when unreadable); None (and
    the file removed) when its lock is free (its holder is gone). Never follows a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(os.pread(fd, 65536, 0) or b"{}")
                return data if isinstance(data, dict) else {}
            return {}
        path.unlink(missing_ok=True)  # a leftover of a process that died
        return None
    finally:
        os.close(fd)


class GpuHold:
    """The lock files one supervisor holds; :meth:`release` (or its death) frees them."""

    def __init__(self) -> None:
        self._held: list[tuple[int, Path]] = []
        self.run = ""

    @classmethod
    def acquire(cls, keys: list[str], *, run: str, share: bool) -> GpuHold:
        """Hold ``keys`` for ``run`` (a run folder, or "" for one not created yet); GpuBusyError
        when another live run holds one of them and ``share`` is False."""
        hold = cls()
        hold.run = run
        folder = lock_dir()
        if folder is None or not keys:
            return hold  # nowhere safe to lock: nothing is checked (documented)
        guard = os.open(folder / ".guard", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            if not share:
                _refuse_if_busy(folder, keys, run)
            for key in keys:
                (folder / key).mkdir(mode=0o700, exist_ok=True)
                path = folder / key / f"{os.getpid()}-{next(_SEQ)}.json"
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                hold._held.append((fd, path))
            hold._write()
        except BaseException:
            hold.release()
            raise
        finally:
            os.close(guard)
        return hold

    def set_run(self, run: str) -> None:
        """The run folder, once it exists (others' messages name it)."""
        self.run = run
        self._write()

    def _write(self) -> None:
        blob = json.dumps({"run": self.run, "pid": os.getpid()}).encode()
        for fd, _ in self._held:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, blob, 0)

    def release(self) -> None:
        held, self._held = self._held, []
        for fd, path in held:
            path.unlink(missing_ok=True)
            os.close(fd)


def _refuse_if_busy(folder: Path, keys: list[str], run: str) -> None:
    busy: dict[str, list[str]] = {}  # holder's run -> GPUs
    for key in keys:
        with contextlib.suppress(FileNotFoundError):
            for entry in sorted((folder / key).iterdir()):
                holder = held_by(entry)
                if holder is None:
                    continue
                other = str(holder.get("run") or "")
                if run and other == run:
                    continue  # a supervisor of the same run (work, resume)
                name = other or "a run being created"
                busy.setdefault(f"{name} (pid {holder.get('pid', '?')})", []).append(key)
    if busy:
        who = "; ".join(f"{', '.join(sorted(set(g)))} by the live run {r}" for r, g in busy.items())
        raise GpuBusyError(
            f"GPUs held on this host: {who}. Wait for it to end, choose other GPUs (--gpus), "
            "or pass --share-gpus to run beside it anyway"
        )
