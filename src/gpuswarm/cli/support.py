"""What every command of the CLI shares: Ctrl-C / SIGTERM and our errors end a command with
its message and exit code (never a traceback), a full disk says so."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import click
from click.core import ParameterSource

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
    """Until the supervisor installs its own handlers, Ctrl-C/SIGTERM/SIGHUP unwind cleanly:
    exit 130 (SIGHUP, a closed terminal, unless the process started with it ignored: nohup).

    Unwinding (not dying) lets a run being created remove its staging folder. Errors of ours
    end the command with their message and exit code.
    """
    wanted = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        wanted.append(signal.SIGHUP)
    old = {s: signal.signal(s, _raise_interrupted) for s in wanted}
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


SHELL_OPTION = click.option(  # run and add: how a command list's lines run
    "--shell/--no-shell",
    default=True,
    help="command list: run each line with /bin/sh -c (the default), or split it into "
    "arguments and run the program without a shell",
)


def refuse_list_options(source: str, yaml_suffixes: tuple[str, ...], *names: str) -> None:
    """A YAML SOURCE with a command-list-only option given (``--timeout``, ``--no-shell``...):
    exit 2 naming it and the config's field, never an option silently left unused."""
    if source == "-" or Path(source).suffix not in yaml_suffixes:
        return
    ctx = click.get_current_context()
    for name in names:
        if ctx.get_parameter_source(name) in (
            ParameterSource.COMMANDLINE,
            ParameterSource.ENVIRONMENT,
        ):
            param = next(p for p in ctx.command.params if p.name == name)
            flag = "/".join(param.opts + param.secondary_opts)
            raise click.UsageError(
                f"{flag} applies to a command list; {source} is a YAML config: set "
                f"{name}: in its defaults: or on a task instead"
            )


def fail(exc: GpuswarmError) -> NoReturn:
    click.echo(f"gpuswarm: error: {exc}", err=True)
    sys.exit(exc.exit_code)
