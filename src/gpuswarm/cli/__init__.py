"""The ``gpuswarm`` command line: parse, call, print. Nothing else lives here.

Every command is loaded when it is asked for (:class:`_Commands`): ``gpuswarm --version`` or
``status`` does not import the engine, the config models or the backends of ``run``."""

from __future__ import annotations

import importlib
from typing import ClassVar

import click

from gpuswarm import __version__

_SUPERVISE = "gpuswarm.cli.supervise"
_RUNS = "gpuswarm.cli.runs"
_CONTROL = "gpuswarm.cli.control"  # the queue verbs: see _Commands.table


class _Commands(click.Group):
    """The top-level group: each command's module is imported when the command is asked for
    (``research``: git, proposers, plots; ``dashboard``: Starlette; ``run``: the engine)."""

    lazy: ClassVar[dict[str, tuple[str, str]]] = {
        "run": (_SUPERVISE, "run"),
        "resume": (_SUPERVISE, "resume"),
        "work": (_SUPERVISE, "work"),
        "demo": (_SUPERVISE, "demo"),
        "status": (_RUNS, "status"),
        "watch": (_RUNS, "watch_cmd"),
        "logs": (_RUNS, "logs_cmd"),
        "ls": (_RUNS, "ls_cmd"),
        "report": (_RUNS, "report_cmd"),
        "check": (_RUNS, "check"),
        "clean": (_RUNS, "clean_cmd"),
        "unquarantine": (_RUNS, "unquarantine"),
        "research": ("gpuswarm.research.commands", "research"),
        "dashboard": ("gpuswarm.cli.dashboard", "dashboard"),  # Starlette only when it runs
        "agents": ("gpuswarm.cli.agents", "agents"),  # issue 20
        "exporter": ("gpuswarm.cli.exporter", "exporter"),  # issue 37: metrics only
    }

    @classmethod
    def table(cls, name: str | None = None) -> dict[str, tuple[str, str]]:
        """Every lazy command; the queue verbs (cli/control.py's, one per ``core.verbs.Kind``)
        are looked up only when ``name`` is none of the others (``--version`` loads nothing)."""
        if name is not None and name in cls.lazy:
            return cls.lazy
        from gpuswarm.core.verbs import Kind

        return {**cls.lazy, **{kind.value: (_CONTROL, kind.value) for kind in Kind}}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.table()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        table = self.table(cmd_name)
        if cmd_name in table:
            module, attr = table[cmd_name]
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuswarm")
def cli() -> None:
    """Keep every GPU of a machine busy with long, independent jobs, and lose none of them."""


def main() -> None:
    cli(prog_name="gpuswarm")
