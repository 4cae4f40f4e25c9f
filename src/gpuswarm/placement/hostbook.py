"""GPU memory reservations shared by every supervisor of this host (issue 19): a second
supervisor of a run (``gpuswarm work``) or another run beside it (``--share-gpus``) sees what
the others reserved before their CUDA contexts exist, so supervisors started together never
double-book a GPU either.

In the per-user lock folder of :mod:`.hostlock`, each supervisor holds one file per GPU,
``reservations/<vendor>-<id>/<pid>-<n>.json``, under an exclusive ``flock`` for as long as it
runs (the kernel drops the lock when it dies: a file whose lock is free is a leftover, removed).
It says ``{"mb": what its attempts on that GPU take (the larger of each one's reservation and
what it holds), "used": what its processes hold now}``. Another supervisor counts the others'
``mb`` as taken and takes their ``used`` out of the memory NVML shows as foreign (it is theirs,
already counted). Every read and write, and each supervisor's whole claim (predicate, claim,
reservation), happens under one guard ``flock`` (``reservations/.guard``), so no claim of one
supervisor falls between another's look and its reservation.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from gpuswarm.placement.hostlock import held_by, lock_dir

_SEQ = itertools.count(1)


class HostBook:
    """This supervisor's files, one per GPU, and a look at the other supervisors' ones."""

    def __init__(self, folder: Path, vendor: str, gpus: Sequence[int]) -> None:
        self.folder = folder
        self.vendor = vendor
        self._lock = threading.RLock()  # a flock is per open file: threads need their own lock
        self._guard = os.open(folder / ".guard", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._depth = 0
        self._seen: dict[int, tuple[int, int]] = {}  # others(), while the guard is held
        self._mine: dict[int, tuple[int, Path]] = {}
        self._said: dict[int, tuple[int, int]] = {}
        try:
            for gpu in gpus:
                sub = folder / f"{vendor}-{gpu}"
                sub.mkdir(mode=0o700, exist_ok=True)
                path = sub / f"{os.getpid()}-{next(_SEQ)}.json"
                flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                fd = os.open(path, flags, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._mine[gpu] = (fd, path)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(cls, vendor: str, gpus: Sequence[int]) -> HostBook | None:
        """The book of these GPUs, or None where no safe lock folder exists (then each
        supervisor knows its own reservations only)."""
        base = lock_dir()
        if base is None or not gpus:
            return None
        folder = base / "reservations"
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
            return cls(folder, vendor, gpus)
        except OSError:
            return None

    @contextlib.contextmanager
    def guard(self, *, wait: bool = True) -> Iterator[bool]:
        """Hold the host's guard (re-entrant in a thread; other threads and processes wait).
        ``wait`` False: yields False at once instead of waiting when it is held elsewhere."""
        if not self._lock.acquire(blocking=wait):
            yield False
            return
        try:
            if self._depth == 0 and self._guard >= 0:
                try:
                    fcntl.flock(self._guard, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    yield False
                    return
            self._depth += 1
            try:
                yield True
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._seen.clear()  # the others may write once we let go
                    if self._guard >= 0:
                        fcntl.flock(self._guard, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def publish(self, gpu: int, mb: int, used: int, *, wait: bool = True) -> None:
        """Say what this supervisor takes on ``gpu`` (written only when it changed; ``wait``
        False: skipped while the guard is busy, the next call says it)."""
        mine = self._mine.get(gpu)
        if mine is None or self._said.get(gpu) == (mb, used):
            return
        blob = json.dumps({"mb": mb, "used": used, "pid": os.getpid()}).encode()
        with self.guard(wait=wait) as held:
            if not held:
                return
            with contextlib.suppress(OSError):
                os.ftruncate(mine[0], 0)
                os.pwrite(mine[0], blob, 0)
            self._said[gpu] = (mb, used)

    def others(self, gpu: int) -> tuple[int, int]:
        """(MiB the other live supervisors take on ``gpu``, MiB their processes hold there)."""
        with self.guard():
            seen = self._seen.get(gpu)
            if seen is not None:
                return seen  # nobody else writes while we hold the guard
            mine = self._mine.get(gpu)
            taken = held = 0
            with contextlib.suppress(FileNotFoundError):
                for entry in (self.folder / f"{self.vendor}-{gpu}").iterdir():
                    if mine is not None and entry == mine[1]:
                        continue
                    said = _read_held(entry)
                    if said is not None:
                        taken += said[0]
                        held += said[1]
            self._seen[gpu] = (taken, held)
            return taken, held

    def close(self) -> None:
        mine, self._mine = self._mine, {}
        for fd, path in mine.values():
            path.unlink(missing_ok=True)
            os.close(fd)
        if self._guard >= 0:
            os.close(self._guard)
            self._guard = -1


def _read_held(path: Path) -> tuple[int, int] | None:
    """(mb, used) of a file a live supervisor holds; None (and the file removed) for a leftover."""
    data = held_by(path)
    if data is None:
        return None
    mb, used = data.get("mb", 0), data.get("used", 0)
    if not isinstance(mb, int) or not isinstance(used, int):
        return (0, 0)
    return max(0, mb), max(0, used)
