"""``gpuswarm dashboard [PATH...]``: parse and start the dashboard (``gpuswarm.dashboard``).

``cli.py`` loads this module only for this command, and the web stack (Starlette, uvicorn, the
``dashboard`` extra) is imported only when the command runs: ``gpuswarm run`` never loads it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gpuswarm.cli.support import stoppable
from gpuswarm.core.errors import EXIT_INTERRUPTED, BadInputError, Interrupted

EXTRA_HINT = "pip install 'gpuswarm[dashboard]'"


class MissingExtraError(BadInputError):
    """The dashboard's web dependencies are not installed."""


@click.command("dashboard")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=0, help="port (default: a free one)")
@click.option(
    "--bind",
    metavar="ADDRESS",
    default="127.0.0.1",
    show_default=True,
    help="listen on another address (0.0.0.0: every interface); the token is still needed",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="a host name the page may be opened by (beside IP addresses and localhost)",
)
@click.option("--read-only", is_flag=True, help="serve without the actions (cancel, retry, ...)")
def dashboard(
    paths: tuple[Path, ...], port: int, bind: str, allow_hosts: tuple[str, ...], read_only: bool
) -> None:
    """Serve a live web dashboard of runs and research experiments.

    PATH is a run folder, a workspace of runs or a research experiment (or a repository holding
    experiments); default ./runs and the workspaces of the runs in the index of your runs
    (wherever they are). Runs started later under a workspace appear by themselves.
    The URL printed on stdout carries a token: only that URL opens the dashboard.
    """
    with stoppable(viewer=True):
        try:
            import starlette  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as exc:
            raise MissingExtraError(
                f"the dashboard needs Starlette and uvicorn ({exc.name} is missing): {EXTRA_HINT}"
            ) from None
        from gpuswarm.dashboard.catalog import classify
        from gpuswarm.dashboard.server import Settings
        from gpuswarm.dashboard.serving import serve

        roots = [classify(p) for p in (paths or _your_workspaces())]
        if bind != "127.0.0.1":
            click.echo(
                f"gpuswarm: listening on {bind}: anyone who can reach it and has the URL's token "
                "can see these runs" + ("" if read_only else " and change their queues"),
                err=True,
            )
        settings = Settings(
            roots=roots, read_only=read_only, port=port, bind=bind, allow_hosts=allow_hosts
        )
        try:
            code = serve(settings, stream=sys.stdout)
        except Interrupted as exc:  # uvicorn stopped on it, then raised it again for us
            click.echo(f"gpuswarm: dashboard stopped ({exc}); the runs go on", err=True)
            code = EXIT_INTERRUPTED
    sys.exit(code)


def _your_workspaces() -> list[Path]:
    """./runs (where it is) and the workspace of each run in the index of the user's runs
    (``<workspace>/<name>/run_*``), each once; ./runs alone when there is none (its "no such
    folder" says what to pass)."""
    from gpuswarm.store.runindex import indexed_runs

    here = Path("runs")
    found = [here.resolve()] if here.is_dir() else []
    for run in indexed_runs():
        workspace = run.parent.parent
        if workspace not in found and not any(workspace.is_relative_to(f) for f in found):
            found.append(workspace)
    return found or [here]
