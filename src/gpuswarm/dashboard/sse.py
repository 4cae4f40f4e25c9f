"""Server-Sent Events: the framing, the wake-ups, and the streams the pages follow.

A run's stream is fed from its journal: each message's id is the journal's byte offset after
the last line it covers, so a page whose connection dropped reconnects with ``Last-Event-ID``
and gets exactly the events it missed (an ``update``), or a fresh ``snapshot`` when the offset
cannot be resumed from. Streams sleep on a :class:`Signal` the server's one poller sets when a
hub changed: an idle stream costs nothing but a comment every ``KEEPALIVE`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

KEEPALIVE = 15.0
RETRY_MS = 1000  # how soon a browser reconnects after a dropped stream


def frame(event: str, data: Any, ident: str | int | None = None) -> bytes:
    """One SSE message (``data`` as one JSON line: no newline can split it)."""
    head = f"id: {ident}\n" if ident is not None else ""
    body = json.dumps(data, separators=(",", ":"), default=str)
    return f"{head}event: {event}\nretry: {RETRY_MS}\ndata: {body}\n\n".encode()


def comment(text: str = "") -> bytes:
    return f": {text}\n\n".encode()


_NUMBER = re.compile(r"[0-9]{1,18}")  # ASCII digits only (str.isdigit takes "²"), < 2**63


def number(value: str | None) -> int | None:
    """A non-negative number a client sent (a header, a query value); None when absent,
    malformed or longer than 18 digits (``int()`` of 5,000 digits raises: never a 500)."""
    if value is None or _NUMBER.fullmatch(value.strip()) is None:
        return None
    return int(value.strip())


def last_event_id(value: str | None) -> int | None:
    """The journal offset a reconnecting page resumes from; None when absent or malformed."""
    return number(value)


class Signal:
    """Wakes every stream waiting on one key (a hub's id, or ``"*"`` for the runs page). Each
    key counts its firings, so a stream that was busy when one came does not miss it."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}
        self._counts: dict[str, int] = {}
        self.stopping = asyncio.Event()

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)

    def fire(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    def stop(self) -> None:
        self.stopping.set()
        for key in list(self._events):
            self.fire(key)

    async def wait(self, key: str, seen: int, timeout: float) -> bool:
        """Until ``key`` has fired more than ``seen`` times, the server stops, or ``timeout``
        (then False)."""
        if self.stopping.is_set() or self.count(key) != seen:
            return True
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


async def follow(
    signal: Signal,
    key: str,
    first: Callable[[], bytes | None],
    next_frame: Callable[[], bytes | None],
    *,
    keepalive: float = KEEPALIVE,
) -> AsyncIterator[bytes]:
    """A stream: ``first()``, then ``next_frame()`` after every wake-up (None: nothing new),
    a comment when idle, until the server stops (the client's leaving cancels the body)."""
    seen = signal.count(key)
    opening = await asyncio.to_thread(first)
    yield opening if opening is not None else comment("open")
    while not signal.stopping.is_set():
        woke = await signal.wait(key, seen, keepalive)
        if signal.stopping.is_set():
            return
        if not woke:
            yield comment()
            continue
        seen = signal.count(key)
        data = await asyncio.to_thread(next_frame)
        if data is not None:
            yield data
