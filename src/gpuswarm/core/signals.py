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


def signal_text(signum: int) -> str:
    """How a person names a stop signal: ``Ctrl-C (SIGINT)``, ``SIGTERM``."""
    name = signal.Signals(signum).name
    return f"Ctrl-C ({name})" if signum == signal.SIGINT else name


@contextmanager
def on_stop_signals(
    callback: Callable[[], None], *, named: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Call ``callback`` on each SIGINT/SIGTERM while the block runs (main thread only);
    ``named`` first gets the signal's :func:`signal_text`."""

    def handler(signum: int, frame: object) -> None:
        if named is not None:
            named(signal_text(signum))
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
