"""The task page: one task's record (attempts, reasons, result fields, metrics) and its log,
followed live across attempts by ``outputs.tasklog.follow`` (no symlink followed, bounded
reads, a hop to each retry's log), with secrets redacted line by line.

A log stream's message ids are ``<attempt>:<offset>`` (bytes of that attempt's log sent so
far), so a page that reconnects resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import shlex
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.errors import BadInputError
from gpuswarm.core.models import AttemptRecord, Descriptor, State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import Redactor, inert
from gpuswarm.dashboard import sse
from gpuswarm.dashboard.payloads import TaskDetail
from gpuswarm.outputs.tasklog import Ended, Hop, LogTarget, follow
from gpuswarm.store.lookup import locate
from gpuswarm.store.reader import RunReader

LOG_TAIL = 256 << 10  # of a log longer than this, a page first gets its end
QUEUE_ITEMS = 256


class NoSuchTaskError(BadInputError):
    """The page asks for a task the run does not have."""


def _attempt(a: AttemptRecord, redactor: Redactor) -> dict[str, object]:
    """Every field of the attempt's record (a new one shows without code here), its text
    redacted."""
    out: dict[str, object] = redactor.tree(a.field_values())
    out["reason"] = inert(redactor.text(a.reason or ""))
    out["oom"] = bool(a.oom)
    out["metrics"] = redactor.tree(a.metrics or {})
    return out


def task_detail(paths: RunPaths, task: str, redactor: Redactor) -> TaskDetail:
    """Everything the task page shows but the log (redacted by the run's ``redactor`` and the
    task's own env)."""
    reader = RunReader(paths)
    hit = locate(reader, task)
    if hit is None:
        raise NoSuchTaskError(f"task {task!r}: this run has no such task")
    desc = reader.read(hit.state, hit.file) or Descriptor({"id": task, "task": {}})
    desc.default_id(task)
    redactor = redactor.including(desc.env)
    running = next((r for r in reader.running() if r.task == task), None)
    last = desc.last_counted
    spec = desc.task
    command = spec.get("command")
    shown = redactor.command(command) if isinstance(command, str | list) else None
    return {
        "id": task,
        "name": inert(redactor.name(desc.name)),
        "state": State.PENDING.value if running and running.waiting else hit.state.value,
        "waiting": bool(running and running.waiting),
        "retry_at": running.retry_at if running else None,
        "reason": inert(redactor.text(desc.reason or "")),
        "priority": desc.priority,
        "max_attempts": desc.max_attempts,
        "used": desc.attempts_used,
        "timeout": desc.timeout,
        "command": shown,
        # as a shell takes it back: an argv quoted word by word (a shell line is its own text)
        "command_line": shlex.join(str(a) for a in shown) if isinstance(shown, list) else shown,
        "cwd": redactor.text(str(spec["cwd"])) if spec.get("cwd") else None,
        "running": None
        if running is None or running.waiting
        else {"slot": running.slot, "since": running.since, "attempt": running.attempt},
        "attempts": [_attempt(a, redactor) for a in desc.attempts],
        "metrics": redactor.tree((last.metrics if last else None) or {}),
        "result": redactor.tree(desc.result or {}),
        "logs": reader.attempt_numbers(task),
        "env": sorted(desc.env),  # names only: values may be secrets
    }


@dataclass
class _Chunk:
    kind: str  # text | hop | end
    attempt: int
    offset: int
    text: str = ""


class LogPump:
    """A thread following one task's logs into an asyncio queue (the page's stream)."""

    def __init__(
        self, paths: RunPaths, task: str, resume: tuple[int, int] | None, redactor: Redactor
    ) -> None:
        self.paths = paths
        self.task = task
        self.resume = resume
        self.stop = threading.Event()
        reader = RunReader(paths)
        hit = locate(reader, task)
        if hit is None:
            raise NoSuchTaskError(f"task {task!r}: this run has no such task")
        desc = reader.read(hit.state, hit.file)
        self.redactor = redactor.including(desc.env if desc is not None else None)
        first = resume[0] if resume else 1
        self.target = LogTarget(paths, task, hit.state.value, first, None, reader.live())

    def _clean(self, data: bytes) -> str:
        lines = data.decode("utf-8", errors="replace").split("\n")
        shown = [next((p for p in reversed(line.split("\r")) if p), "") for line in lines]
        return inert(self.redactor.text("\n".join(shown)), keep_newlines=True)

    def run(self, put: Callable[[_Chunk], None]) -> None:
        """Follow until the task ended and its logs are read, or :attr:`stop` is set. Only
        whole lines are sent (a line cut in two could hide a secret from redaction), but for
        a last line without its newline when an attempt ends."""
        attempt, consumed, skip, partial = 0, 0, 0, b""
        for item in follow(self.target, stop=self.stop.is_set):
            if self.stop.is_set():
                return
            if isinstance(item, Hop):
                if partial:
                    put(_Chunk("text", attempt, consumed, self._clean(partial)))
                    partial = b""
                attempt, consumed = item.attempt, 0
                skip = self._skip(item.attempt, item.log)
                put(_Chunk("hop", attempt, skip))
            elif isinstance(item, bytes):
                consumed += len(item)
                if skip:
                    cut = min(skip, len(item))
                    skip -= cut
                    item = item[cut:]
                data = partial + item
                end = data.rfind(b"\n") + 1
                partial = data[end:]
                if end:
                    put(
                        _Chunk(
                            "text", attempt, consumed - len(partial), self._clean(data[: end - 1])
                        )
                    )
            elif isinstance(item, Ended):
                if partial:
                    put(_Chunk("text", attempt, consumed, self._clean(partial)))
                put(_Chunk("end", attempt, consumed, item.state))
                return

    def _skip(self, attempt: int, log: Path) -> int:
        """Bytes of a log a page does not get: what it had (resuming), or all but the end."""
        if self.resume is not None and attempt == self.resume[0]:
            return self.resume[1]
        try:
            size = log.stat().st_size
        except OSError:
            return 0
        return max(0, size - LOG_TAIL)


async def log_stream(pump: LogPump, signal: sse.Signal) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[_Chunk] = asyncio.Queue()

    def put(chunk: _Chunk) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, chunk)

    thread = threading.Thread(target=pump.run, args=(put,), name="log-pump", daemon=True)
    thread.start()
    try:
        yield sse.comment("log")
        while not signal.stopping.is_set():
            try:
                chunk = await asyncio.wait_for(queue.get(), sse.KEEPALIVE)
            except asyncio.TimeoutError:
                yield sse.comment()
                continue
            ident = f"{chunk.attempt}:{chunk.offset}"
            if chunk.kind == "text":
                yield sse.frame("text", {"attempt": chunk.attempt, "text": chunk.text}, ident)
            elif chunk.kind == "hop":
                data = {"attempt": chunk.attempt, "skipped": chunk.offset}
                yield sse.frame("attempt", data, ident)
            else:
                yield sse.frame("end", {"attempt": chunk.attempt, "state": chunk.text}, ident)
                return
    finally:
        pump.stop.set()


def parse_resume(value: str | None) -> tuple[int, int] | None:
    """A log stream's ``Last-Event-ID`` (``<attempt>:<offset>``)."""
    if not value or ":" not in value:
        return None
    a, b = (sse.number(part) for part in value.partition(":")[::2])
    if a is None or b is None or a < 1:
        return None
    return a, b
