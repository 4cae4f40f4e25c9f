"""events.jsonl: the append-only journal of a run, one JSON line per state transition.

Each line has ``ts`` (unix seconds), ``ev`` (the event kind) and event fields. Lines are appended
with one ``write(2)`` on an ``O_APPEND`` descriptor, so concurrent writers (threads or several
supervisors) never interleave inside a line. Readers tolerate a torn last line.
(The kinds, ``Ev``, and their typed payloads live in ``core/events.py``.)
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuswarm.core import faults
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import dumps_compact
from gpuswarm.core.records import event_problem, parse_event

Listener = Callable[[dict[str, Any]], None]
TEXT_FIELDS = ("reason", "name")  # free text an event may carry (a name, a quoted file error)
_REDACTED_KEPT = 4096  # redacted texts a ledger remembers


class Ledger:
    """Appends events; calls listeners (the terminal reporter) with each event."""

    def __init__(
        self,
        path: Path,
        *,
        durable: bool = True,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.path = path
        self.durable = durable
        self.redact = redact  # the run's redactor over TEXT_FIELDS (a supervisor's ledger)
        self._redacted: dict[str, str] = {}  # its results: "exit 0" is every done task's reason
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._dirty = False

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def relay(self, record: dict[str, Any]) -> None:
        """Hand the listeners (the terminal reporter) a record another process journaled
        (a Slurm worker node's, ui/nodefeed.py, checked there); nothing is written."""
        for listener in self._listeners:
            listener(record)

    def emit(self, ev: Ev, **fields: Any) -> dict[str, Any]:
        if self.redact is not None:
            for key in TEXT_FIELDS:
                value = fields.get(key)
                if isinstance(value, str) and value:
                    fields[key] = self._redacted_text(self.redact, value)
        record: dict[str, Any] = {"ts": round(time.time(), 4), "ev": ev.value, **fields}
        testing = faults.armed()  # (the points' context is a copy of the record)
        if testing:
            faults.point("ledger.emit.before", **record)
        line = dumps_compact(record)
        with self._lock:
            os.write(self._fd, line)
            self._dirty = True
        for listener in self._listeners:
            listener(record)
        if testing:
            faults.point("ledger.emit.after", **record)
        return record

    def _redacted_text(self, redact: Callable[[str], str], value: str) -> str:
        """``value`` redacted, from what this ledger redacted before (a pure function of the
        text and the run's secrets: the same reasons recur; at most _REDACTED_KEPT kept)."""
        done = self._redacted.get(value)
        if done is None:
            done = redact(value)
            if len(self._redacted) >= _REDACTED_KEPT:
                self._redacted.clear()
            self._redacted[value] = done
        return done

    def sync(self) -> None:
        """fsync the journal (called on heartbeats and at exit, not per line)."""
        with self._lock:
            if self._dirty and self._fd >= 0:
                os.fsync(self._fd)
                self._dirty = False

    def close(self) -> None:
        self.sync()
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete, parseable event line of a journal, in order."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # torn last line
            event = parse_event(raw)
            if event is not None:  # a line that is no JSON object is skipped (check reports it)
                yield event


def tail_events(path: Path, max_bytes: int = 1 << 20) -> list[dict[str, Any]]:
    """The events in the last ``max_bytes`` of a journal (cheap on huge runs)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            fh.seek(start)
            data = fh.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # first line is partial
    out: list[dict[str, Any]] = []
    for raw in lines[:-1]:  # the last element is "" or a torn line
        event = parse_event(raw)
        if event is not None:
            out.append(event)
    return out


def read_range(path: Path, start: int, end: int) -> list[dict[str, Any]] | None:
    """The events of the complete lines in bytes ``[start, end)`` of a journal (a reader
    resuming at an offset it was given); None when ``start`` is no line's first byte or the
    range is past the journal's end (another journal, or a wrong offset)."""
    if not 0 <= start <= end:
        return None
    try:
        with path.open("rb") as fh:
            if start > 0:
                fh.seek(start - 1)
                if fh.read(1) != b"\n":
                    return None
            data = fh.read(end - start)
    except FileNotFoundError:
        return None
    if len(data) != end - start or (data and not data.endswith(b"\n")):
        return None
    out: list[dict[str, Any]] = []
    for raw in data.split(b"\n")[:-1]:
        event = parse_event(raw)
        if event is not None:
            out.append(event)
    return out


class EventTail:
    """New complete lines of a journal since the last call (reads only what was appended)."""

    def __init__(self, path: Path, *, from_end: bool = True, start: int | None = None) -> None:
        self.path = path
        if start is not None:  # a reader resuming where it stopped (a line's first byte)
            self.offset = start
        else:
            self.offset = path.stat().st_size if from_end and path.exists() else 0
        self._partial = b""

    @property
    def position(self) -> int:
        """The offset just after the last complete line returned: where a reader that stops
        now resumes (a line still being written is read again whole)."""
        return self.offset - len(self._partial)

    def grew(self) -> bool:
        """Whether the journal holds bytes not read yet (one stat: an idle follower's cost)."""
        try:
            return self.path.stat().st_size != self.offset
        except FileNotFoundError:
            return False

    def poll(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # a line still being written
        out = []
        for raw in lines:
            event = parse_event(raw)
            if event is not None:
                out.append(event)
        return out


def bad_event_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, why)`` for each complete journal line that is no JSON object."""
    out: list[tuple[int, str]] = []
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return out
    with fh:
        for number, raw in enumerate(fh, 1):
            if not raw.endswith(b"\n"):
                break
            try:
                why = event_problem(json.loads(raw))
            except (ValueError, RecursionError):
                why = "not JSON"
            if why is not None:
                out.append((number, why))
    return out
