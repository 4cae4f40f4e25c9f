"""Command lists (one command per line) as tasks, without a model per line.

A 100,000-line list would cost 100,000 validated :class:`TaskSpec` models (hundreds of MB and
seconds). Its tasks differ only in id, name and command, so :class:`CommandTasks` keeps one
validated template and a row per line; every line is still checked (placeholders, quoting) when
the list is loaded, and errors name the line.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shlex
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

from gpuswarm.config.direct import DirectRule
from gpuswarm.config.instances import Instance
from gpuswarm.config.models import TaskOptions, TaskSpec, task_dump
from gpuswarm.config.tasks import check_template, make_spec, split_command
from gpuswarm.config.values import check_command_size
from gpuswarm.config.yamlload import Locator
from gpuswarm.core.jsontemplate import JsonTemplate, TemplateError, hole
from gpuswarm.core.placeholders import (
    PLACEHOLDERS_AT_LAUNCH,
    PLACEHOLDERS_AT_LOAD,
    uses_placeholder,
)
from gpuswarm.core.redact import name_redactor
from gpuswarm.core.taskdump import TaskDump

NAME_MAX = 60
Row = tuple[str, str, list[str] | str]  # id, name, command


class CommandTasks(Sequence[TaskSpec]):
    """The tasks of a command list: one template (a validated TaskSpec's dump) and its rows."""

    def __init__(self, template: TaskDump, rows: list[Row]) -> None:
        self._template = template
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> TaskSpec: ...

    @overload
    def __getitem__(self, index: slice) -> list[TaskSpec]: ...

    def __getitem__(self, index: int | slice) -> TaskSpec | list[TaskSpec]:
        if isinstance(index, slice):
            return [TaskSpec.model_validate(self.dump(i)) for i in range(len(self))[index]]
        return TaskSpec.model_validate(self.dump(range(len(self))[index]))

    def dump(self, index: int) -> TaskDump:
        """What ``self[index].model_dump(mode="json")`` returns, without building the model."""
        task_id, name, command = self._rows[index]
        out = self._template.copy()
        out["id"], out["name"] = task_id, name
        out["command"] = list(command) if isinstance(command, list) else command
        return out

    def ids(self) -> list[str]:
        return [row[0] for row in self._rows]

    def with_holes(self) -> TaskDump:
        """The shared dump with :func:`~gpuswarm.core.jsontemplate.hole` 0, 1 and 2 for id,
        name and command: ``dump(i)`` is it with row ``i``'s values (:meth:`rows`) put in."""
        return {**self._template, "id": hole(0), "name": hole(1), "command": hole(2)}

    def rows(self) -> Sequence[Row]:
        """``(id, name, command)`` of each line, in order (read-only)."""
        return self._rows

    def dumps(self) -> Iterator[TaskDump]:
        return (self.dump(i) for i in range(len(self._rows)))

    def clear(self) -> None:
        self._rows = []


def command_tasks(
    lines: list[tuple[int, str]],
    opts: TaskOptions,
    source: str,
    base_dir: Path,
    grace: float,
    config_dir: Path | None = None,
    known: Iterable[str] = (),
    direct: bool = False,
) -> CommandTasks:
    """Check every line and build the tasks: ids ``cmd-<line number>`` (zero padded to at least
    5 digits), names the line cut to 60 characters. ``{config_dir}`` is ``config_dir`` (the
    list file's folder), else ``base_dir``; every task carries it when one line uses it.
    ``known``: placeholders a later step supplies too (``{repeat}``: config/cmdrepeats.py).
    ``direct``: a shell line that needs no shell is stored as its argv (config/direct.py)."""
    width = max(5, len(str(lines[-1][0])))
    allowed = {*PLACEHOLDERS_AT_LAUNCH, *PLACEHOLDERS_AT_LOAD, *known}
    rows: list[Row] = []
    names = name_redactor(opts.env)
    rule = _direct_rule(opts) if direct else None

    def at(number: int) -> Locator:  # made only where it is needed: 100k lines are checked
        return Locator(source, {(): number})

    for number, line in lines:
        if "\0" in line:
            raise at(number).error(
                (), "the command holds a NUL byte, which no argument can carry; remove it"
            )
        try:
            check_command_size(line)
        except ValueError as exc:
            raise at(number).error((), str(exc)) from None
        if "{" in line or "}" in line:
            check_template(line, allowed, at(number), (), "the command")
        # a direct line closes its quotes (config/direct.py): split_command has nothing to check
        command = (rule.argv(line) if rule is not None else None) or split_command(
            line, opts.shell, at(number), (), shell_hint="drop --no-shell"
        )
        name = names.name(line)[:NAME_MAX]  # names are written and shown: no tokens
        rows.append((f"cmd-{number:0{width}d}", name, command))
    uses = uses_placeholder((line for _, line in lines), "config_dir")
    first = make_spec(
        Instance(rows[0][1], {}, f"line {lines[0][0]}"),
        rows[0][2],
        opts,
        grace=grace,
        base_dir=base_dir,
        task_id=rows[0][0],
        names=names,
    )
    if uses:  # the first line may not use it: the template every row shares carries it
        folder = str(config_dir or base_dir)
        first = first.model_copy(update={"vars": {**first.vars, "config_dir": folder}})
    return CommandTasks(task_dump(first), rows)


def _direct_rule(opts: TaskOptions) -> DirectRule | None:
    """The rule for ``opts``' lines; None keeps every line on /bin/sh: no shell default, an
    agent wraps the command, or the tasks' PATH is their own."""
    if not opts.shell or opts.agent is not None or "PATH" in opts.env:
        return None
    return DirectRule(os.environ.get("PATH"))


def through_shell(tasks: CommandTasks) -> CommandTasks:
    """``tasks`` with each direct line given back to /bin/sh (``shlex.join``: the same argv),
    for a backend that runs the command elsewhere (a container's PATH is not this one)."""
    if not len(tasks) or tasks.with_holes().get("shell") is not True:
        return tasks
    out = copy.copy(tasks)
    out._rows = [(i, n, shlex.join(c) if isinstance(c, list) else c) for i, n, c in tasks.rows()]
    return out


def task_dumps(tasks: Sequence[TaskSpec]) -> Iterator[TaskDump]:
    """The JSON dicts of ``tasks``, one at a time (no model is built for a command list)."""
    if isinstance(tasks, CommandTasks):
        return tasks.dumps()
    return (task_dump(t) for t in tasks)


def tasks_digest(tasks: Sequence[TaskSpec], layout: Mapping[str, object]) -> str:
    """sha256 of ``json.dumps({**layout, "tasks": tasks sorted by id}, sort_keys=True,
    separators=(",", ":"), ensure_ascii=False)``, hashed piece by piece: the same digest,
    without a string of the whole task list in memory."""
    digest = hashlib.sha256()
    keys = sorted([*layout, "tasks"])
    digest.update(b"{")
    for n, key in enumerate(keys):
        digest.update(_dumps(key).encode() + b":")
        if key == "tasks":
            digest.update(b"[")
            _update_items(digest, _sorted_dumps(tasks))
            digest.update(b"]")
        else:
            digest.update(_dumps(layout[key]).encode())
        if n < len(keys) - 1:
            digest.update(b",")
    digest.update(b"}")
    return digest.hexdigest()


def _sorted_dumps(tasks: Sequence[TaskSpec]) -> Iterable[str]:
    """Each task's text (``_dumps``), sorted by id; a command list's through one template."""
    if isinstance(tasks, CommandTasks):
        rows = tasks.rows()
        order = sorted(range(len(rows)), key=lambda i: rows[i][0])
        try:
            template = JsonTemplate(tasks.with_holes(), (1, 1, 1), _dumps, ensure_ascii=False)
        except TemplateError:  # a value of the shared dump looks like a hole: the long way
            return (_dumps(tasks.dump(i)) for i in order)
        return (template.fill(rows[i]) for i in order)
    return (_dumps(t) for t in sorted(task_dumps(tasks), key=lambda t: str(t["id"])))


def _update_items(digest: Any, items: Iterable[str]) -> None:
    first = True
    for item in items:
        if not first:
            digest.update(b",")
        digest.update(item.encode())
        first = False


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
