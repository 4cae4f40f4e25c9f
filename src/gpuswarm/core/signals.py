"""Ctrl-C / SIGTERM / SIGHUP (the terminal closed) as a callback (the supervisor's
warm-then-cold stop, the research loop's), and the process's own end (:func:`leave`)."""

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
    """How a person names a stop signal: ``Ctrl-C (SIGINT)``, ``SIGTERM``, ``SIGHUP (the terminal
    closed)``."""
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:
        return f"Ctrl-C ({name})"
    return f"{name} (the terminal closed)" if signum == signal.SIGHUP else name


@contextmanager
def on_stop_signals(
    callback: Callable[[], None], *, named: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Call ``callback`` on each SIGINT/SIGTERM/SIGHUP while the block runs (main thread
    only); ``named`` first gets the signal's :func:`signal_text`. A closed terminal (SIGHUP)
    stops like SIGTERM (a warm stop, nothing lost), never a crash leaving its tasks orphaned;
    a process started with SIGHUP ignored (``nohup``) keeps ignoring it."""

    def handler(signum: int, frame: object) -> None:
        if named is not None:
            named(signal_text(signum))
        callback()

    wanted = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup's wish stands
        wanted.append(signal.SIGHUP)
    old = {s: signal.signal(s, handler) for s in wanted}
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
