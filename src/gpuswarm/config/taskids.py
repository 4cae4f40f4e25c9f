"""One task per id: two instances that give one id are refused, unless they are one task folder.

Two glob entries may select one folder under one id: the same settings are one task, a folder
one entry excludes is the other's, and other settings are refused (issue 28). Every refusal is
a :class:`ConfigError` located with a :class:`Locator`, naming the first use of the id.
"""

from __future__ import annotations

from typing import NoReturn

from gpuswarm.config.instances import Instance
from gpuswarm.config.models import TaskEntry, TaskSpec
from gpuswarm.config.yamlload import Locator, PathKey, format_path, quote
from gpuswarm.core.placeholders import find_placeholders


def same_folder(a: Instance, b: Instance) -> bool:
    """Both instances are one task folder (glob matches), not merely one id."""
    return bool(a.unit) and a.unit == b.unit


def keeps_first(
    spec: TaskSpec,
    first: TaskSpec,
    inst: Instance,
    first_path: PathKey,
    loc: Locator,
    path: PathKey,
) -> bool:
    """Two glob entries selected one folder under one id: True keeps the first's task, False
    takes the second's (the first excludes the folder); different settings are refused."""
    if spec.skip_reason is not None:
        return True
    if first.skip_reason is not None:
        return False
    fields = _differences(spec, first)
    if not fields:
        return True  # the same task twice: one task
    line = loc.line(first_path)
    at = f" (line {line})" if line is not None else ""
    raise loc.error(
        path,
        f"the task folder {inst.vars.get('task_rel', inst.unit)} is selected already by "
        f"{format_path(first_path)}{at}, with other settings ({', '.join(fields)}); a folder "
        "is one task: narrow one glob or exclude: the folder from one entry, or give one a "
        'name: of its own (e.g. "v2-{task_rel}") to run it twice',
    )


def _differences(a: TaskSpec, b: TaskSpec) -> list[str]:
    """The fields in which two specs of one folder differ (``vars``: only those used)."""
    one, two = a.model_dump(), b.model_dump()
    texts = [a.command] if isinstance(a.command, str) else list(a.command)
    texts += [t for t in (a.cwd, a.done_when) if t is not None] + list(a.env.values())
    used = {key for text in texts for key in find_placeholders(text)}
    out = [key for key in one if key != "vars" and one[key] != two[key]]
    out += [f"{{{key}}}" for key in sorted(used) if a.vars.get(key) != b.vars.get(key)]
    return out


def refuse_duplicate(
    spec: TaskSpec,
    inst: Instance,
    first: tuple[Instance, PathKey],
    entry: TaskEntry,
    loc: Locator,
    path: PathKey,
) -> NoReturn:
    other, other_path = first
    line = loc.line(other_path)
    at = f" at line {line}" if line is not None else ""
    raise loc.error(
        path,
        f"task id {quote(spec.id)} (name {quote(spec.name)}) of {inst.label} is already used by "
        f"{other.label}{at}; task ids must be unique: {_dedupe_hint(entry)}",
    )


def _dedupe_hint(entry: TaskEntry) -> str:
    if entry.matrix is not None:
        example = "-".join(f"{k}{{{k}}}" for k in entry.matrix)
        return f'use every matrix key in the name, e.g. name: "{example}"'
    if entry.glob is not None:
        return (
            "two task folders give one id (ids are their paths relative to tasks_root, made "
            'safe): rename one folder, or keep {task_rel} in the name, e.g. name: "v2-{task_rel}"'
        )
    return "set a different name: on one of them"
