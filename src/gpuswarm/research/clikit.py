"""What every ``gpuswarm research`` command shares: our errors end it with their message and
exit code (as JSON too under --json), durations as flags take (300, 90s, 10m, 8h), the
-C/--tag/--json options, printing plain data as text or JSON."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from gpuswarm.config.budget import parse_tokens
from gpuswarm.config.values import parse_duration
from gpuswarm.core.errors import GpuswarmError, ResearchError

F = TypeVar("F", bound=Callable[..., Any])

P = TypeVar("P", bound=Mapping[str, object])  # a command's payload


def handle_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GpuswarmError as exc:
            click.echo(f"gpuswarm: error: {exc}", err=True)
            if kwargs.get("as_json"):  # a script reading stdout gets the error as JSON too
                click.echo(json.dumps({"error": str(exc), "exit_code": exc.exit_code}))
            sys.exit(exc.exit_code)

    return wrapper  # type: ignore[return-value]


def flag_duration(flag: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ResearchError(f"{flag} {value!r}: {exc} (e.g. 300, 90s, 10m, 8h)") from None


def flag_tokens(flag: str, value: str | None) -> int | None:
    """``--budget-tokens 20M``: a count of tokens, as ``budget.tokens`` takes it."""
    if value is None:
        return None
    try:
        return parse_tokens(value)
    except ValueError as exc:
        raise ResearchError(f"{flag}: {exc}") from None


def experiment_options(fn: F) -> F:
    fn = click.option("--tag", help="the experiment (default: the last one `init` made here)")(fn)
    fn = click.option(
        "-C",
        "where",
        default=".",
        type=click.Path(file_okay=False, path_type=Path),
        help="the git repository (default: the current folder)",
    )(fn)
    return click.option("--json", "as_json", is_flag=True, help="machine-readable output")(fn)


def emit(as_json: bool, data: P, show: Callable[[P], None]) -> None:
    """``data`` (a command's payload, research/payloads.py) as JSON, or ``show``'s text."""
    if as_json:
        click.echo(json.dumps(data, indent=1, default=str))
    else:
        show(data)
