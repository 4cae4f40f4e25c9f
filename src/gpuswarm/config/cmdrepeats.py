"""``--repeats k`` for a command list (issue 34): every line runs k independent times.

A step after :func:`gpuswarm.config.commands.command_tasks`: line task ``cmd-00003`` becomes
``cmd-00003-r1`` ... ``cmd-00003-r<k>`` (names ``<name>-r<j>``), as a YAML entry's repeats
(:mod:`gpuswarm.config.repeats`), each with ``repeat`` = ``j`` among its variables (so
``{repeat}`` is filled in at launch like every other placeholder: shell-quoted in a shell
line) and the spec fields ``repeat_of`` and ``repeat`` the outputs group by. No model is built
per task: the rows stay rows of one template.
"""

from __future__ import annotations

from pathlib import Path

from gpuswarm.config.commands import CommandTasks, Row, command_tasks
from gpuswarm.config.models import TaskOptions
from gpuswarm.config.repeats import REPEAT
from gpuswarm.core.taskdump import TaskDump


class RepeatedCommandTasks(CommandTasks):
    """A command list's tasks, each repeated: the rows and which repeat of which task each is."""

    def __init__(self, template: TaskDump, rows: list[Row], of: list[tuple[str, int]]):
        super().__init__(template, rows)
        self._of = of

    def dump(self, index: int) -> TaskDump:
        out = super().dump(index)
        repeat_of, j = self._of[index]
        out["vars"] = {**out.get("vars", {}), REPEAT: str(j)}
        out["repeat_of"], out["repeat"] = repeat_of, j
        return out

    def clear(self) -> None:
        super().clear()
        self._of = []


def repeated_commands(tasks: CommandTasks, k: int | None) -> CommandTasks:
    """``tasks`` with each task ``k`` times (None: as they are)."""
    if k is None or len(tasks) == 0:
        return tasks
    template = tasks.dump(0)  # the first dump, as every row's template
    rows: list[Row] = []
    of: list[tuple[str, int]] = []
    for dump in tasks.dumps():
        task_id, name, command = dump["id"], dump["name"], dump["command"]
        for j in range(1, k + 1):
            rows.append((f"{task_id}-r{j}", f"{name}-r{j}", command))
            of.append((task_id, j))
    return RepeatedCommandTasks(template, rows, of)


def list_tasks(
    lines: list[tuple[int, str]],
    opts: TaskOptions,
    label: str,
    base_dir: Path,
    grace: float,
    source: Path | None,
    direct: bool = False,
) -> CommandTasks:
    """The tasks of a command list read from ``source`` (None: stdin; ``{config_dir}`` is its
    folder, else ``base_dir``), each ``opts.repeats`` times (``{repeat}`` then known);
    ``direct``: as :func:`~gpuswarm.config.commands.command_tasks`'."""
    folder = source.expanduser().resolve().parent if source is not None else base_dir
    known = (REPEAT,) if opts.repeats is not None else ()
    tasks = command_tasks(
        lines, opts, label, base_dir, grace, config_dir=folder, known=known, direct=direct
    )
    return repeated_commands(tasks, opts.repeats)
