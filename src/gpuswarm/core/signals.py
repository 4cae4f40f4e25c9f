"""Ctrl-C / SIGTERM as a callback (the supervisor's warm-then-cold stop, the research loop's)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def on_stop_signals(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` on each SIGINT/SIGTERM while the block runs (main thread only)."""

    def handler(signum: int, frame: object) -> None:
        callback()

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
