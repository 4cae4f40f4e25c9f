"""Who may touch a run, and when a claimed task's owner is gone.

Two ``flock`` files in ``.parallel/`` (the kernel drops a lock when its holder dies, even by
SIGKILL, so a stale lock never blocks anyone):

- ``lock``: exclusive, held only while a supervisor initialises (recovery, reclaiming), so two
  initialisations never clobber each other's queue;
- ``live``: shared, held by every live supervisor for its whole life. ``resume`` needs it
  exclusively (a run with a live supervisor is not resumed); ``work`` shares it.

A running descriptor's lease is in its file name (``...@<owner>@<slot>``); the owner is
``host:pid:start``. Its heartbeat is the mtime of ``.parallel/owners/<owner>``, renewed every few
seconds without scanning any folder. An owner is gone when, on this host, its pid is dead or was
reused (start time differs), or, on any host, its heartbeat is older than ``lease_ttl``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import psutil

from gpuswarm.core.errors import RunLockedError
from gpuswarm.core.fsutil import atomic_write_bytes, atomic_write_json
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.paths import host_slug as host_slug  # slot ids spell the host so
from gpuswarm.placement.gpus import Slot, slot_id

OWNER_VAR = "GPUSWARM_OWNER"


def owner_id() -> str:
    """``host:pid:start``: names this supervisor process uniquely, even after pid reuse."""
    start = int(psutil.Process().create_time() * 100)
    return f"{host_slug()}:{os.getpid()}:{start}"


def owner_file(paths: RunPaths, owner: str) -> Path:
    return paths.owner_file(owner)


class OwnerDetail(TypedDict, total=False):
    """What an owner file says besides who and since when."""

    slots: list[str]  # the labels of its slots, by index


def write_owner_file(paths: RunPaths, owner: str, detail: OwnerDetail) -> Path:
    path = owner_file(paths, owner)
    path.parent.mkdir(exist_ok=True)
    atomic_write_json(path, {"owner": owner, "since": time.time(), **detail})
    return path


def add_owner_slots(paths: RunPaths, owner: str, slots: list[Slot]) -> None:
    """Slots that joined a live supervisor (a cluster's node): their labels go into its owner
    file by slot index, so a lease on one names its slot (status, watch, reclaim)."""
    path = owner_file(paths, owner)
    try:
        with path.open("rb") as fh:
            info = json.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return
    if not isinstance(info, dict):
        return
    found = info.get("labels")
    labels: dict[str, str] = dict(found) if isinstance(found, dict) else {}
    labels.update({str(s.index): s.label for s in slots})
    atomic_write_json(path, {**info, "labels": labels})


def owner_alive(paths: RunPaths, owner: str, lease_ttl: float, now: float | None = None) -> bool:
    """Whether the supervisor ``owner`` still holds its leases."""
    parts = owner.split(":")
    if len(parts) == 3 and parts[0] == host_slug() and parts[1].isdigit():
        try:
            return int(psutil.Process(int(parts[1])).create_time() * 100) == int(parts[2])
        except (psutil.Error, ValueError):
            return False
    try:
        beat = owner_file(paths, owner).stat().st_mtime
    except FileNotFoundError:
        return False
    return (now if now is not None else time.time()) - beat < lease_ttl


def slot_label(paths: RunPaths, owner: str, index: int) -> str:
    """The label (``gpu3``) of slot ``index`` of supervisor ``owner``, from its owner file."""
    if index < 0:
        return "reclaimer"  # a reclaimer's lease (``@owner@-1.x``): no slot runs it
    try:
        with owner_file(paths, owner).open("rb") as fh:
            info = json.loads(fh.read())
        joined = info.get("labels") or {}  # slots that joined later (add_owner_slots)
        if str(index) in joined:
            return str(joined[str(index)])
        return str(info.get("slots", [])[index])
    except (OSError, ValueError, IndexError, TypeError, AttributeError):
        return f"slot {index}"


def _take_slot_id(
    paths: RunPaths, ident: str, owner: str, lease_ttl: float, host: str = ""
) -> bool:
    """Register ``ident`` for ``owner`` (O_EXCL), or take over a registration of a dead owner.
    The file holds the owner, then (a cluster's slot) the host the slot is on."""
    path = paths.slot_file(ident)
    body = owner.encode() + b"\n" + (host.encode() + b"\n" if host else b"")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        try:
            holder = path.read_text().split("\n", 1)[0].strip()
        except OSError:
            holder = ""
        if holder == owner:
            if host:
                atomic_write_bytes(path, body)
            return True
        if holder and owner_alive(paths, holder, lease_ttl):
            return False
        atomic_write_bytes(path, body)  # under the init lock: no race
        return True
    with os.fdopen(fd, "wb") as fh:
        fh.write(body)
    return True


def slot_host(paths: RunPaths, ident: str) -> str | None:
    """The host a cluster's slot is on (its registration's second line); None for a slot of
    the supervisor's own host, or one not registered."""
    try:
        with open(paths.slot_file(ident), "rb") as fh:
            lines = fh.read(4096).decode(errors="replace").splitlines()
    except (OSError, ValueError):
        return None
    return lines[1].strip() or None if len(lines) > 1 else None


def register_slots(paths: RunPaths, owner: str, slots: list[Slot], lease_ttl: float) -> list[Slot]:
    """Give each slot an id unique within the run and naming host + GPU (``<host>-gpu3``).

    Called under the init lock. Each id is a file in ``.parallel/slots/`` created with
    ``O_EXCL``; an id a live supervisor holds (a second ``work`` of this host on the same GPU)
    makes this slot take the next share number (``<host>-gpu3.1``, ``.2``, ...); an id whose
    holder is gone (a crash, an earlier supervisor) is taken over, so a resume keeps its lanes
    and homes. Registrations are never removed: the folder lists every slot the run has had.
    """
    paths.slots.mkdir(exist_ok=True)
    host = host_slug()
    taken: set[str] = set()
    out = []
    for slot in slots:
        share = slot.share
        while True:
            ident = slot_id(host, slot.gpu_ids, share)
            if ident not in taken and _take_slot_id(paths, ident, owner, lease_ttl):
                break
            share += 1
        taken.add(ident)
        out.append(dataclasses.replace(slot, ident=ident))
    return out


def register_named_slots(
    paths: RunPaths, owner: str, slots: list[Slot], lease_ttl: float
) -> list[Slot]:
    """Register slots whose ids their backend made (a cluster's: ``<host>-<node>-gpu0``) in
    ``.parallel/slots/``, taking over a dead holder's registration (a resumed run)."""
    paths.slots.mkdir(exist_ok=True)
    for slot in slots:
        _take_slot_id(paths, slot.label, owner, lease_ttl, slot.host)
    return slots


def registered_slot_ids(paths: RunPaths) -> list[str]:
    """Every slot id the run has had (the timeline's lanes), [] for runs made before ids."""
    try:
        return sorted(n for n in os.listdir(paths.slots) if not n.startswith("."))
    except FileNotFoundError:
        return []


def on_this_host(owner: str) -> bool:
    return owner.split(":", 1)[0] == host_slug()


class FileLock:
    """A ``flock`` on one file; shared or exclusive, never blocking unless asked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, exclusive: bool, wait: float = 0.0) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, mode)
                self._fd = fd
                return True
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


LIVE_WAIT = 5.0  # seconds a supervisor waits for the live lock a probe holds for an instant


def is_live(paths: RunPaths) -> bool:
    """Whether any supervisor holds the run's ``live`` lock."""
    if not paths.live_lock.exists():
        return False
    probe = FileLock(paths.live_lock)
    if probe.acquire(exclusive=True):
        probe.release()
        return False
    return True


def _live_owners(paths: RunPaths) -> str:
    owners = paths.owners
    names = sorted(p.name.replace("_", ":") for p in owners.iterdir()) if owners.is_dir() else []
    return ", ".join(names[-3:]) or "another process"


class Attachment:
    """A supervisor's hold on a run: the init lock while initialising, ``live`` for its life."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self.init = FileLock(paths.lock)
        self.live = FileLock(paths.live_lock)

    def end_init(self) -> None:
        """Let other supervisors initialise (called once recovery/reclaiming is done)."""
        self.init.release()


@contextlib.contextmanager
def attach(paths: RunPaths, *, exclusive_start: bool) -> Iterator[Attachment]:
    """Take the init lock (waiting a little for another initialisation), then ``live``.

    ``exclusive_start`` (resume) refuses a run that has a live supervisor.
    """
    hold = Attachment(paths)
    if not hold.init.acquire(exclusive=True, wait=30.0):
        raise RunLockedError(f"{paths.root}: another gpuswarm is initialising this run; retry")
    try:
        if exclusive_start and is_live(paths):
            raise RunLockedError(
                f"{paths.root} is live: supervisor {_live_owners(paths)} is running it; watch it "
                f"with 'gpuswarm status {paths.root}', add GPUs with 'gpuswarm work', or stop it"
            )
        # a reader's liveness probe (is_live: status, watch, the dashboard every second) holds
        # the lock exclusively for an instant: wait it out, never run without the lock
        if not hold.live.acquire(exclusive=False, wait=LIVE_WAIT):
            raise RunLockedError(f"{paths.root}: its live lock stayed taken; retry")
        yield hold
    finally:
        hold.init.release()
        hold.live.release()
