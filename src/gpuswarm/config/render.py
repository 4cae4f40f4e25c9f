"""One attempt's command, environment and working folder, rendered from its TaskSpec and the
launch placeholders ({gpu}, {attempt}, ...): what exec/ launches."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.placeholders import render, render_shell, shell_split

SHELL = "/bin/sh"


def _values(task: TaskSpec, values: Mapping[str, str]) -> dict[str, str]:
    return {**task.vars, **values}


def render_command(task: TaskSpec, values: Mapping[str, str]) -> list[str]:
    """The argv to launch: ``[/bin/sh, -c, rendered]`` for shell tasks, else each arg rendered.
    A shell task whose command is a list is a command-list line that needs no shell
    (:mod:`gpuswarm.config.direct`): its argv, as ``/bin/sh`` would exec it.

    In a shell command each value is quoted for the shell (``{key!raw}`` splices it as is).

    ``values`` (the launch placeholders) win over the task's own :attr:`TaskSpec.vars`.
    """
    merged = _values(task, values)
    if task.shell and isinstance(task.command, str):
        return [SHELL, "-c", render_shell(task.command, merged)]  # values quoted for the shell
    argv = task.command if isinstance(task.command, list) else shell_split(task.command)
    return [render(arg, merged) for arg in argv]


def render_env(task: TaskSpec, values: Mapping[str, str]) -> dict[str, str]:
    """The task's env with placeholders filled."""
    merged = _values(task, values)
    return {key: render(value, merged) for key, value in task.env.items()}


def render_cwd(task: TaskSpec, values: Mapping[str, str], base_dir: Path) -> Path:
    """The working folder of an attempt: rendered, relative results joined to ``base_dir``."""
    if task.cwd is None:
        return base_dir
    path = Path(render(task.cwd, _values(task, values)))
    with contextlib.suppress(RuntimeError):  # ~nosuchuser from a value: stays as it is
        path = path.expanduser()
    return path if path.is_absolute() else base_dir / path
