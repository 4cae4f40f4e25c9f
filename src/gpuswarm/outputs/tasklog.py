"""``gpuswarm logs``: a task's output, its last attempt's (or a chosen one's) ``output.log``, and
:func:`follow`, which reads a growing log like ``tail -f`` and hops to the next attempt when the
task is retried.

A log is a file the task controls: it is opened with ``O_NOFOLLOW | O_NONBLOCK`` (never through a
symlink, never a FIFO: :func:`gpuswarm.core.taskfiles.open_regular`) and read in bounded chunks,
only the bytes not read yet. The open descriptor stays on the log the supervisor writes even if
the task replaces the name. A log that is no regular file when it is opened (the task replaced it
by a symlink or a FIFO) is never read nor waited on: :func:`follow` says so (:class:`Unreadable`)
and ``gpuswarm logs -f`` exits 1 naming the file and why.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from gpuswarm.core.errors import BadInputError
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import Redactor
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.core.taskfiles import UnsafeFile, open_regular, read_tail
from gpuswarm.store.lookup import TaskHit, locate, resolve_task, task_ended
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import open_run

CHUNK = 1 << 16  # bytes per read
BURST = 1 << 20  # bytes read from one log before the follower looks around again
TEXT_LIMIT = 1 << 20  # what --json puts in "text" at most (the log's end)
POLL = 0.2  # seconds between looks while nothing new comes


class NoSuchAttemptError(BadInputError):
    """``--attempt N`` names an attempt the task does not have."""


class LogJson(TypedDict):
    """``gpuswarm logs --json``'s record of the log it shows."""

    task: str
    attempt: int | None
    log: str | None
    state: str


@dataclass(frozen=True)
class LogTarget:
    """Which log of which task: the attempt is None when the task never started."""

    paths: RunPaths
    task: str
    state: str
    attempt: int | None
    log: Path | None
    live: bool = True  # whether a supervisor was on the run when it was looked up

    def as_json(self) -> LogJson:
        return {
            "task": self.task,
            "attempt": self.attempt,
            "log": str(self.log) if self.log is not None else None,
            "state": self.state,
        }


def log_redactor(target: LogTarget) -> Redactor:
    """The run's one redactor (as status, the report and the dashboard use it) with the
    task's own env: what ``gpuswarm logs`` prints goes through it."""
    reader = RunReader(target.paths)
    hit = locate(reader, target.task)
    desc = reader.read(hit.state, hit.file) if hit is not None else None
    return run_redactor(open_run(target.paths.root)[1], desc.env if desc is not None else None)


def task_log(run_dir: Path, task_arg: str, attempt: int | None = None) -> LogTarget:
    """The log ``gpuswarm logs RUN TASK [--attempt N]`` shows: the task's newest attempt
    folder's (a lost attempt, whose supervisor died, has one too), or attempt ``attempt``'s."""
    paths, _ = open_run(run_dir)
    hit = resolve_task(paths, task_arg)
    reader = RunReader(paths)
    numbers = reader.attempt_numbers(hit.id)
    if attempt is not None and attempt not in numbers:
        have = ", ".join(map(str, numbers)) or "none yet"
        raise NoSuchAttemptError(
            f"task {hit.id} has no attempt {attempt} (its attempts: {have}); "
            "leave out --attempt for the last one"
        )
    n = attempt if attempt is not None else (numbers[-1] if numbers else None)
    log = paths.attempt_log(hit.id, n) if n is not None else None
    return LogTarget(paths, hit.id, hit.state.value, n, log, reader.live())


def read_text(log: Path, limit: int = TEXT_LIMIT) -> tuple[str, bool]:
    """The log's last ``limit`` bytes as text, and whether its start was left out."""
    data, cut = read_tail(log, limit)
    return data.decode("utf-8", errors="replace"), cut


def iter_log(log: Path) -> Iterator[bytes]:
    """The log's bytes as they are now, in chunks (OSError when it cannot be opened safely)."""
    reader = _LogReader(log)
    try:
        while chunk := reader.read(CHUNK):
            yield chunk
    finally:
        reader.close()


class _LogReader:
    """One open log and how far it has been read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = open_regular(path)
        self.offset = 0

    def read(self, budget: int = BURST) -> bytes:
        """The bytes written since the last read, at most ``budget``. A log that shrank was cut
        to hold its cap: reading goes on from its new end."""
        size = os.fstat(self.fd).st_size
        if size < self.offset:
            self.offset = size
        out: list[bytes] = []
        got = 0
        while got < budget:
            chunk = os.pread(self.fd, min(CHUNK, budget - got), self.offset)
            if not chunk:
                break
            self.offset += len(chunk)
            got += len(chunk)
            out.append(chunk)
        return b"".join(out)

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Hop:
    """The follower starts reading attempt ``attempt`` (the first one, or a retry's)."""

    attempt: int
    log: Path


@dataclass(frozen=True)
class Ended:
    """The task has ended (``state``) and every log of it has been read to its end."""

    state: str


@dataclass(frozen=True)
class Unreadable:
    """Attempt ``attempt``'s log is no regular file (``why``: a task replaced it by a symlink
    or a FIFO): it was not opened through, and none of it is read."""

    attempt: int
    log: Path
    why: str


FollowItem = bytes | Hop | Ended | Unreadable


def follow(
    target: LogTarget, poll: float = POLL, stop: Callable[[], bool] | None = None
) -> Iterator[FollowItem]:
    """Follow the task's output from ``target``'s attempt on (the first attempt when it never
    started): the log's new bytes as they come, a :class:`Hop` when a later attempt's log
    appears (a retry), and :class:`Ended` once the task has ended and its logs are drained.
    ``stop``: asked before each wait; True ends the follow (its reader has gone)."""
    paths, task = target.paths, target.task
    reader = RunReader(paths)
    current: _LogReader | None = None
    hit: TaskHit | None = None
    number = (target.attempt or 1) - 1  # the attempt being read (none yet: the one before)
    try:
        while True:
            if current is not None:
                data = current.read()
                if data:
                    yield data
                    continue
            later = [n for n in reader.attempt_numbers(task) if n > number]
            opened, n = _open_first(paths, task, later)
            if isinstance(opened, Unreadable):
                if current is not None:
                    yield from _drain(current)
                    current.close()
                current, number = None, n
                yield opened
                continue
            if opened is not None:
                if current is not None:
                    yield from _drain(current)
                    current.close()
                current, number = opened, n
                yield Hop(number, current.path)
                continue
            hit = where(reader, task, hit)
            if hit is not None and task_ended(hit.state):
                yield from _finish(reader, hit, current, number)
                return
            if stop is not None and stop():
                return
            time.sleep(poll)
    finally:
        if current is not None:
            current.close()


def where(reader: RunReader, task: str, last: TaskHit | None) -> TaskHit | None:
    """Where the task is now: where it was while its file is still there (one stat; every move
    of a task renames its file), else looked up again in every state folder."""
    if last is not None and reader.holds(last.state, last.file):
        return last
    return locate(reader, task)


def _finish(
    reader: RunReader, hit: TaskHit, current: _LogReader | None, number: int
) -> Iterator[FollowItem]:
    """The end of a followed task: the rest of this log, then of any later attempt's."""
    if current is not None:
        yield from _drain(current)
    for n in (n for n in reader.attempt_numbers(hit.id) if n > number):
        opened = _open(reader.paths, hit.id, n)
        if opened is None:
            continue
        if isinstance(opened, Unreadable):
            yield opened
            continue
        try:
            yield Hop(n, opened.path)
            yield from _drain(opened)
        finally:
            opened.close()
    yield Ended(hit.state.value)


def _drain(log: _LogReader) -> Iterator[bytes]:
    while data := log.read():
        yield data


def _open_first(
    paths: RunPaths, task: str, numbers: list[int]
) -> tuple[_LogReader | Unreadable | None, int]:
    """The first of attempts ``numbers`` whose log opens; one that does not open is passed over
    only when a later attempt exists (so it will never be written)."""
    for i, n in enumerate(numbers):
        opened = _open(paths, task, n)
        if opened is not None or i == len(numbers) - 1:
            return opened, n
    return None, 0


def _open(paths: RunPaths, task: str, n: int) -> _LogReader | Unreadable | None:
    """Attempt ``n``'s log, opened; None while it is not there yet (its folder is made first);
    :class:`Unreadable` when it is no regular file (a task replaced it by a symlink or a FIFO)."""
    path = paths.attempt_log(task, n)
    try:
        return _LogReader(path)
    except UnsafeFile as exc:
        return Unreadable(n, path, exc.strerror or str(exc))
    except OSError:
        return None
