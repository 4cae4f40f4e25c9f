"""What every command of the CLI shares: Ctrl-C / SIGTERM and our errors end a command with
its message and exit code (never a traceback), a full disk says so."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

from gpuswarm.core.errors import (
    EXIT_INTERRUPTED,
    DiskFullError,
    GpuswarmError,
    Interrupted,
    disk_full,
)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signal.Signals(signum).name)


@contextmanager
def stoppable(viewer: bool = False) -> Iterator[None]:
    """Until the supervisor installs its own handlers, Ctrl-C/SIGTERM unwind cleanly: exit 130.

    Unwinding (not dying) lets a run being created remove its staging folder. Errors of ours
    end the command with their message and exit code.
    """
    old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except GpuswarmError as exc:
        fail(exc)
    except OSError as exc:
        if not disk_full(exc):
            raise
        where = f" ({exc.filename})" if exc.filename else ""
        fail(DiskFullError(f"the disk is full: {exc.strerror}{where}; free some space"))
    except Interrupted as exc:
        if viewer:  # watch started nothing and stops nothing: only the viewing ends
            click.echo(f"gpuswarm: stopped watching ({exc}); the run itself goes on", err=True)
        else:
            click.echo(f"gpuswarm: stopped by {exc} before any task started", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def fail(exc: GpuswarmError) -> NoReturn:
    click.echo(f"gpuswarm: error: {exc}", err=True)
    sys.exit(exc.exit_code)
