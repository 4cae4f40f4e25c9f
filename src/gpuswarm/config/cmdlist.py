"""A command list's text as numbered lines, and the RunConfig that stands for the list.

The RunConfig is what run.json records as the run's config: an entry per line (the line its
command, its name redacted and cut like the task's), the first 1000 lines; a longer list is one
entry that names its source, since the queue holds every command anyway.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from gpuswarm.config.backends import config_model
from gpuswarm.config.commands import NAME_MAX
from gpuswarm.config.errors import config_error
from gpuswarm.config.models import RunConfig, TaskEntry, TaskOptions
from gpuswarm.config.yamlload import Locator
from gpuswarm.core.redact import name_redactor

COMMANDS_IN_SNAPSHOT = 1000  # a longer command list is summarised in run.json's config


def command_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, command)`` of each line that is not blank or a ``#`` comment."""
    out: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append((number, line))
    return out


def command_config(
    name: str, base_dir: Path, opts: TaskOptions, lines: list[tuple[int, str]], source: str
) -> RunConfig:
    """The run's config for a list of ``lines`` run with ``opts`` (a ConfigError names
    ``source`` when ``opts`` do not make a valid config)."""
    if len(lines) <= COMMANDS_IN_SNAPSHOT:
        shown = lines
    else:  # run.json names the source; the queue holds every command
        shown = [(0, f"{len(lines)} commands from {source}, the first: {lines[0][1]}")]
    names = name_redactor(opts.env)
    entries = [
        {"name": names.name(line)[:NAME_MAX], "command": line, "shell": opts.shell}
        for _, line in shown
    ]
    data = {
        "name": name,
        "workspace": str(base_dir / "runs"),
        "gpus_per_task": max(1, opts.gpus or 1),
        "defaults": opts,
        "tasks": [TaskEntry.model_validate(entry) for entry in entries],
    }
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, data, Locator(source), config_model(RunConfig)) from None
