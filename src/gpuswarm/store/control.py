"""Control requests: what a person asked of a live run, as durable records in its folder.

``gpuswarm cancel`` of a running task cannot act on a process another supervisor (or host)
holds; it writes a request, ``.parallel/control/<ns>-<kind>-<rand>.json``, which every live
supervisor reads on its keeper tick (one ``listdir`` of a folder that is usually empty) and the
one holding the task applies: it stops the attempt, commits it ``cancelled`` and journals
``control`` (who asked, who applied, when). A request is removed once applied (or once its task
has ended anyway), so a crash at any point applies it at most once; a request nobody applies
(its task's supervisor died) is applied by recovery (resume, reclaim, ``check --repair``).

A request is bound to the attempt it was made for (``attempt``: the number of the attempt that
ran, or the retry that waited, when it was asked): once that attempt or a later one has an
outcome that counts (done, failed, skipped; an interrupted one has none), the request is too
late (:func:`too_late`) and is dropped without doing anything, journaled as such. So a cancel
that arrives as its attempt ends never cancels a retry of the task (automatic, or a person's
``gpuswarm retry``). A request of an older version has no attempt and applies as before.

Pause is a flag, not a request: ``paused`` (the whole run) and ``paused@<slot-id>`` (one slot).
Supervisors claim nothing while it is there; running tasks go on.

Each record is written temp + fsync + rename, read with a size bound, and one that does not
parse is ignored (and left for ``check`` to report), never a reason to stop a run.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact
from gpuswarm.core.models import Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.names import task_id_of
from gpuswarm.store.queue import DirQueue

KINDS = ("cancel",)
MAX_REQUEST_BYTES = 64 << 10  # a request is a few hundred bytes; more is not one of ours
MAX_REQUESTS = 10_000  # read per tick at most (the rest wait for the next ticks)
PAUSED = "paused"  # the whole run; paused@<slot-id>: one slot


class _Body(TypedDict):
    kind: str
    task: str
    by: str
    at: float
    reason: str


class RequestBody(_Body, total=False):
    """A request file's JSON (:func:`put`)."""

    attempt: int


@dataclass(frozen=True)
class Request:
    """One control request: ``kind`` (cancel) of ``task``, asked by ``by`` at ``at``."""

    name: str  # its file name in .parallel/control/
    kind: str
    task: str
    by: str
    at: float
    reason: str = ""
    attempt: int | None = None  # the attempt it was made for (None: any, an older request)


def asker() -> str:
    """Who asks, for the journal and the terminal: ``<user>@<host>, pid <pid>`` (the user's
    name, not a bare uid, where the environment has no USER, as in a container)."""
    return f"{user_name()}@{socket.gethostname()}, pid {os.getpid()}"


def user_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (a container's --user)
        return os.environ.get("USER") or f"uid {os.getuid()}"


def put(
    paths: RunPaths, kind: str, task: str, reason: str = "", attempt: int | None = None
) -> Request:
    """Record a request durably; live supervisors apply it on their next tick. ``attempt``:
    the attempt it is for (the running descriptor's ``next_attempt``), see :func:`too_late`."""
    if kind not in KINDS:
        raise ValueError(f"unknown control request {kind!r}")
    folder = paths.control
    folder.mkdir(exist_ok=True)
    name = f"{time.time_ns():020d}-{kind}-{uuid.uuid4().hex[:8]}.json"
    req = Request(name, kind, task, asker(), time.time(), reason, attempt)
    body: RequestBody = {"kind": kind, "task": task, "by": req.by, "at": req.at, "reason": reason}
    if attempt is not None:
        body["attempt"] = attempt
    atomic_write_bytes(folder / name, dumps_compact(body))
    return req


def requests(paths: RunPaths, cache: dict[str, Request | None] | None = None) -> list[Request]:
    """The recorded requests, oldest first (unreadable or foreign files are skipped).

    ``cache``: the caller's memory of files read before (name -> request, None: unusable). A
    request file is written once under a fresh name and never changed, so a supervisor that
    asks every tick reads each file once: a tick then costs one ``listdir``."""
    try:
        names = sorted(n for n in os.listdir(paths.control) if n.endswith(".json"))
    except FileNotFoundError:
        if cache is not None:
            cache.clear()
        return []
    names = names[:MAX_REQUESTS]
    out = []
    for name in names:
        if cache is not None and name in cache:
            req = cache[name]
        else:
            req = _read(paths.control / name)
            if cache is not None:
                cache[name] = req
        if req is not None:
            out.append(req)
    if cache is not None and len(cache) > len(names):
        for gone in set(cache) - set(names):  # dropped by someone: forget them
            del cache[gone]
    return out


def drop_requests(paths: RunPaths, tasks: set[str]) -> list[Request]:
    """Remove every request of ``tasks`` (a retry requeues them); returns those this call
    removed."""
    if not tasks:
        return []
    return [req for req in requests(paths) if req.task in tasks and drop(paths, req)]


LOOKS = 8  # a task seen moving between pending/ and running/ is looked for this often


def request_cancel(
    queue: DirQueue,
    task: str,
    state: State,
    name: str,
    reason: str,
    announce: Callable[[Descriptor], object],
) -> tuple[State, int | None]:
    """``gpuswarm cancel`` of one task (``state``/``name``: where it was seen): pending ->
    cancelled now (CANCELLED, ``announce`` journals it); running -> a request bound to the
    attempt its descriptor shows under way, or the retry it waits to run (RUNNING, that
    attempt's number); ended -> that state, nothing done."""
    for _ in range(LOOKS):
        if state is State.PENDING:
            if queue.cancel_pending(task, reason, announce) is not None:
                return State.CANCELLED, None
        elif state is State.RUNNING:
            desc = queue.read_desc(State.RUNNING, name)
            if desc is not None:
                attempt = desc.next_attempt
                put(queue.paths, "cancel", task, reason, attempt=attempt)
                return State.RUNNING, attempt
        else:
            return state, None
        state, name = _where(queue, task, state)  # it moved on meanwhile: where to now?
    put(queue.paths, "cancel", task, reason)  # never still: whichever attempt runs
    return State.RUNNING, None


def _where(queue: DirQueue, task: str, was: State) -> tuple[State, str]:
    for state in (State.RUNNING, State.PENDING, *State.terminal()):
        for name in queue.names(state):
            if task_id_of(name) == task:
                return state, name
    return was, ""  # between two folders this instant (a hold): look again


def _read(path: Path) -> Request | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_REQUEST_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > MAX_REQUEST_BYTES:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    kind, task, by, at = data.get("kind"), data.get("task"), data.get("by"), data.get("at")
    if kind not in KINDS or not isinstance(task, str) or not isinstance(by, str):
        return None
    if not isinstance(at, int | float):
        return None
    reason = data.get("reason") if isinstance(data.get("reason"), str) else ""
    attempt = data.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        attempt = None
    return Request(path.name, kind, task, by, float(at), str(reason), attempt)


def too_late(req: Request, desc: Descriptor) -> str | None:
    """Why ``req`` no longer applies to the task ``desc`` describes: the attempt it was made
    for (or a later one) has an outcome that counts; None while it applies. ``desc`` holds the
    attempts recorded so far (a live attempt's claimed descriptor: those before it)."""
    if req.attempt is None:
        return None
    for number, record in enumerate(desc.attempts, start=1):
        if number >= req.attempt and record.counted:
            how = record.reason or record.kind or "an outcome"
            return f"too late: attempt {number} ended ({how}) before the cancel was applied"
    return None


def drop(paths: RunPaths, req: Request) -> bool:
    """Remove an applied request; False when another supervisor removed it first."""
    try:
        (paths.control / req.name).unlink()
    except FileNotFoundError:
        return False
    return True


# -- pause ---------------------------------------------------------------------------------------
def _flag(paths: RunPaths, slot: str | None) -> Path:
    if slot is not None and (not slot or "/" in slot or slot.startswith(".")):
        raise ValueError(f"not a slot id: {slot!r}")
    return paths.control / (PAUSED if slot is None else f"{PAUSED}@{slot}")


def pause(paths: RunPaths, slot: str | None = None) -> bool:
    """Pause the run (``slot`` None) or one slot; False when it was paused already."""
    flag = _flag(paths, slot)
    if flag.exists():
        return False
    paths.control.mkdir(exist_ok=True)
    atomic_write_bytes(flag, dumps_compact({"by": asker(), "at": time.time()}))
    return True


def unpause(paths: RunPaths, slot: str | None = None) -> bool:
    """Lift a pause of the run (``slot`` None) or of one slot; False when there was none."""
    try:
        _flag(paths, slot).unlink()
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True)
class Paused:
    """What is paused now: the whole run, and/or these slots."""

    run: bool
    slots: frozenset[str]

    def holds(self, slot: str) -> bool:
        return self.run or slot in self.slots


def paused(paths: RunPaths) -> Paused:
    """The pause flags as they are now (one listdir)."""
    try:
        names = os.listdir(paths.control)
    except FileNotFoundError:
        return Paused(False, frozenset())
    prefix = f"{PAUSED}@"
    slots = frozenset(n[len(prefix) :] for n in names if n.startswith(prefix))
    return Paused(PAUSED in names, slots)
