"""Ctrl-C / SIGTERM as a callback (the supervisor's warm-then-cold stop, the research loop's),
and the process's own end (:func:`leave`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn


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


def leave(code: int, *, hard: bool = False) -> NoReturn:
    """Exit with ``code``. ``hard``: without the interpreter's exit hooks, once everything of
    ours is written and flushed -- a backend whose cluster is gone (a Ray head that died)
    leaves native threads behind that hold the exit for half a minute, then crash it."""
    if not hard:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)
