"""``gpuswarm exporter [PATH...] --port N``: the Prometheus metrics of runs and experiments,
served alone (``gpuswarm.metrics.exporter``): the base install and ``prometheus_client``, no
dashboard extra. ``cli.py`` loads this module only for this command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from gpuswarm.cli.support import stoppable
from gpuswarm.core.errors import BadInputError

EXTRA_HINT = "pip install prometheus_client (a dependency of gpuswarm: reinstall it)"


class MissingMetricsLibraryError(BadInputError):
    """prometheus_client is not installed."""


@click.command("exporter")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=9640,
    show_default=True,
    help="port to listen on (0: a free one, printed)",
)
@click.option(
    "--bind",
    metavar="ADDRESS",
    default="127.0.0.1",
    show_default=True,
    help="listen on another address (0.0.0.0: every interface)",
)
@click.option(
    "--token-env",
    metavar="NAME",
    default=None,
    help="the variable holding a token: every scrape then needs 'Authorization: Bearer <token>'",
)
def exporter(paths: tuple[Path, ...], port: int, bind: str, token_env: str | None) -> None:
    """Serve the Prometheus metrics (/metrics) of runs and research experiments.

    PATH is a run folder, a workspace of runs or a research experiment (or a repository
    holding experiments); default ./runs. Runs started later under a workspace appear by
    themselves. docs/monitoring.md lists the series and a scrape config.
    """
    with stoppable(viewer=True):
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise MissingMetricsLibraryError(
                f"the exporter needs prometheus_client: {EXTRA_HINT}"
            ) from None
        from gpuswarm.metrics.exporter import serve
        from gpuswarm.metrics.sources import check_paths

        token = _token(token_env)
        if token is None and bind != "127.0.0.1":
            click.echo(
                f"gpuswarm: listening on {bind} without a token (--token-env): anyone who can "
                "reach it can read these runs' metrics",
                err=True,
            )
        roots = check_paths(list(paths) or [Path("runs")])
        serve(roots, bind=bind, port=port, token=token, stream=sys.stdout)


def _token(name: str | None) -> str | None:
    if name is None:
        return None
    value = os.environ.get(name, "")
    if not value:
        raise BadInputError(
            f"--token-env {name}: the variable {name} is not set or empty; "
            f"export {name}=<token> first, or leave --token-env out"
        )
    return value
