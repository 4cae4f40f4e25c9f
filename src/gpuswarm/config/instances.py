"""The instances of one ``tasks:`` entry, before each becomes a :class:`TaskSpec`: one for an
explicit entry, one per combination of a ``matrix:``, one per folder (or file) a ``glob:``
matched, with that folder's ``task_*`` values, the ``{config.<field>}`` values read from its
config.yaml and whether an ``exclude:`` glob skips it.

Everything here raises :class:`ConfigError`, located with a :class:`Locator` where it can be.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.config.models import (
    RunConfig,
    TaskEntry,
    TaskOptions,
    default_name,
)
from gpuswarm.config.values import expand_user, parse_duration
from gpuswarm.config.yamlload import Locator, PathKey, load_yaml, quote
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.placeholders import CONFIG_PREFIX, CONFIG_REF, find_placeholders, render

MAX_TASKS = 1_000_000
_WILDCARD = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Instance:
    """One task an entry produces, before it becomes a :class:`TaskSpec`."""

    name: str
    vars: dict[str, str]
    label: str  # how error messages name it: "tasks[2] (lr=0.1, seed=1)"
    unit: str = ""  # a glob task's folder (or file): overlapping globs give it one task
    skip: str | None = None  # why it is skipped without running (an ``exclude:`` glob)


def instance_name(template: str | None, values: dict[str, str], prefix: str, suffix: str) -> str:
    """Render ``template`` if it uses these values; else ``<template or prefix>-<suffix>``."""
    if template is not None and set(find_placeholders(template)) & set(values):
        return render(template, values)
    return f"{render(template, values) if template is not None else prefix}-{suffix}"


def _matrix_instances(entry: TaskEntry, index: int, loc: Locator) -> list[Instance]:
    matrix = entry.matrix or {}
    count = math.prod(len(values) for values in matrix.values())
    if count > MAX_TASKS:
        raise loc.error(
            ("tasks", index, "matrix"), f"gives {count} combinations, over {MAX_TASKS}; shrink it"
        )
    out: list[Instance] = []
    for combo in itertools.product(*matrix.values()):
        values = dict(zip(matrix, combo, strict=True))
        suffix = "-".join(f"{k}={v}" for k, v in values.items())
        name = instance_name(entry.name, values, f"matrix{index}", suffix)
        label = f"tasks[{index}] ({', '.join(f'{k}={v}' for k, v in values.items())})"
        out.append(Instance(name, values, label))
    return out


def _split_glob(pattern: str, base_dir: Path) -> tuple[Path, str]:
    """``(folder to search, wildcard rest)``: the pattern's non-wildcard prefix and the rest."""
    parts = Path(pattern).expanduser().parts
    fixed = list(itertools.takewhile(lambda part: not _WILDCARD.search(part), parts))
    root = base_dir.joinpath(*fixed) if fixed else base_dir
    return root, "/".join(parts[len(fixed) :])


def _glob_vars(
    match: Path, per_file: bool, tasks_root: Path, loc: Locator, path: PathKey
) -> dict[str, str]:
    """``task_file``, ``task_dir`` and ``task_rel``: the task folder's path relative to the one
    ``tasks_root`` (the config's folder unless ``tasks_root:`` says), whatever glob matched it,
    so a folder gets the same id from ``tasks/**`` and from ``tasks/x/y/config.yaml``. A matched
    file stands for its folder, unless the entry matched several files of that folder
    (``per_file``: ``configs/*.yaml``): then each file is a task (``<folder>/<stem>``)."""
    task_dir = Path(os.path.normpath(match if match.is_dir() else match.parent))
    root = Path(os.path.normpath(tasks_root))
    try:
        rel = task_dir.relative_to(root).as_posix()
    except ValueError:
        raise loc.error(
            path,
            f"the matched task folder {task_dir} is outside {root}, the folder task ids are "
            f"relative to; set tasks_root: to a folder that holds every task folder",
        ) from None
    if per_file:
        rel = match.stem if rel == "." else f"{rel}/{match.stem}"
    elif rel == ".":  # the root itself is the task folder
        rel = task_dir.name or "task"
    return {
        "task_file": os.path.normpath(match),
        "task_dir": str(task_dir),
        "task_rel": rel,
    }


def _check_readable(match: Path, loc: Locator, path: PathKey) -> None:
    task_dir = match if match.is_dir() else match.parent
    if not os.access(task_dir, os.R_OK | os.X_OK) or not os.access(match, os.R_OK):
        raise loc.error(
            path,
            f"the matched task {match} is not readable (permission denied on {task_dir}); "
            "fix its permissions (chmod -R u+rX) or narrow the glob",
        )


def expanded_path(text: str, loc: Locator, path: PathKey) -> Path:
    """``~`` expanded; a bad ``~user`` is a ConfigError at ``path``."""
    try:
        return expand_user(text)
    except ValueError as exc:
        raise loc.error(path, str(exc)) from None


def _glob_matches(
    pattern: str, base_dir: Path, loc: Locator, path: PathKey
) -> tuple[Path, list[Path]]:
    expanded_path(pattern, loc, path)
    root, rest = _split_glob(pattern, base_dir)
    try:
        found = set(root.glob(rest)) if rest and root.is_dir() else set()
    except OSError as exc:
        raise loc.error(
            path, f"cannot search {root}: {exc.strerror}; fix its permissions"
        ) from None
    if not rest and os.path.lexists(root):  # pathlib raises for a name too long to exist
        found = {root}
    if not found:
        missing = "" if os.path.isdir(root) else f" ({root} does not exist)"  # noqa: PTH112
        raise loc.error(
            path,
            f"{quote(pattern)} matches nothing under {root}{missing}; check the pattern: relative "
            f"patterns start at the config file's folder {base_dir}, and ** searches subfolders",
        )
    return root, sorted(found)


def tasks_root_of(config: RunConfig, base_dir: Path) -> Path:
    """The folder glob task ids are relative to: ``tasks_root`` (relative to the config's
    folder) or the config's folder itself."""
    if config.tasks_root is None:
        return base_dir
    root = Path(config.tasks_root).expanduser()
    return root if root.is_absolute() else base_dir / root


def _glob_instances(
    entry: TaskEntry,
    index: int,
    base_dir: Path,
    loc: Locator,
    tasks_root: Path,
    fields: list[FieldUse],
) -> list[Instance]:
    path: PathKey = ("tasks", index, "glob")
    _, matches = _glob_matches(entry.glob or "", base_dir, loc, path)
    if len(matches) > MAX_TASKS:
        raise loc.error(path, f"matches {len(matches)} paths, over {MAX_TASKS}; narrow it")
    template = entry.name if entry.name is not None else "{task_rel}"
    out: list[Instance] = []
    units: set[str] = set()
    is_dir = {m: m.is_dir() for m in matches}
    files_in = Counter(m.parent for m in matches if not is_dir[m])
    for match in matches:
        _check_readable(match, loc, path)
        per_file = not is_dir[match] and files_in[match.parent] > 1
        values = _glob_vars(match, per_file, tasks_root, loc, path)
        unit = values["task_file"] if per_file else values["task_dir"]
        if unit in units:
            continue  # one task per selected folder (a folder and a file in it both matched)
        units.add(unit)
        values.update(_config_fields(Path(values["task_file"]), fields, index))
        name = instance_name(template, values, "", values["task_rel"])
        label = f"tasks[{index}] (match {values['task_file']})"
        skip = excluded_by(match, entry.exclude, base_dir)
        out.append(Instance(name, values, label, unit, skip))
    return out


def excluded_by(match: Path, patterns: list[str], base_dir: Path) -> str | None:
    """``"excluded by <pattern>"`` when a glob of ``exclude:`` (relative to the config's folder,
    like ``glob:``) matches the task's file or its folder; None otherwise."""
    if not patterns:
        return None
    task_dir = match if match.is_dir() else match.parent
    for pattern in patterns:
        full = Path(pattern).expanduser()
        full = full if full.is_absolute() else base_dir / full
        for candidate in (match, task_dir):
            if candidate.match(str(full)) or fnmatch.fnmatch(str(candidate), str(full)):
                return f"excluded by {pattern}"
    return None


# -- fields of the matched config.yaml ({config.<field>}) ------------------------------------------
@dataclass(frozen=True)
class FieldUse:
    """How an entry uses one field of its matched configs: ``{config.<field>}``."""

    key: str  # "config.a.b"
    required: bool  # some use has no ``|default``: a config without the field is refused
    scalar: bool  # used as the timeout: a list cannot go there
    shown: str  # the first use as written, for messages: "{config.a.b}"

    @property
    def field(self) -> str:
        return self.key[len(CONFIG_PREFIX) :]


def config_refs(entry: TaskEntry, opts: TaskOptions) -> list[FieldUse]:
    """The ``config.<field>`` placeholders an entry uses (command, name, env, cwd, done_when,
    timeout, its agent's prompt and folders), in order of first use."""
    texts = [entry.command] if isinstance(entry.command, str) else list(entry.command)
    texts += [t for t in (entry.name, opts.cwd, opts.done_when) if t is not None]
    texts += list(opts.env.values())
    if opts.agent is not None:  # its prompt (a template's text), prompt_file and folders
        agent = opts.agent
        texts += [t for t in (agent.prompt, agent.prompt_file, agent.workdir, agent.copy_from)
                  if isinstance(t, str)]  # fmt: skip
    uses = [(text, False) for text in texts]
    if isinstance(opts.timeout, str):
        uses.append((opts.timeout, True))
    found: dict[str, FieldUse] = {}
    for text, is_timeout in uses:
        for match in CONFIG_REF.finditer(text):
            key, default = match.group(1), match.group(2)
            first = found.get(key)
            found[key] = FieldUse(
                key,
                default is None or (first is not None and first.required),
                is_timeout or (first is not None and first.scalar),
                first.shown if first is not None else match.group(0),
            )
    return list(found.values())


def _matched_config(task_file: Path) -> Path:
    """The YAML file a glob task reads ``{config.*}`` from: the matched file when it is YAML,
    else ``config.yaml`` in the matched folder."""
    if task_file.is_file() and task_file.suffix in (".yaml", ".yml"):
        return task_file
    return (task_file if task_file.is_dir() else task_file.parent) / "config.yaml"


def _config_fields(task_file: Path, refs: list[FieldUse], index: int) -> dict[str, str]:
    """``{"config.<field>": value}`` for each reference, read from the matched config; a field
    the config lacks is left out when every use has a ``|default``."""
    if not refs:
        return {}
    source = _matched_config(task_file)
    used = f"used by tasks[{index}] as {refs[0].shown}"
    try:
        text = source.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read it ({exc.strerror}), {used}") from None
    data, _ = load_yaml(text, str(source))
    out: dict[str, str] = {}
    for ref in refs:
        value: object = data
        for key in ref.field.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[ref.key] = _field_text(value, ref, source, index)
        elif ref.required:
            raise ConfigError(
                f"{source}: has no field {ref.field!r} (used by tasks[{index}] as {ref.shown}); "
                f"add it to that file, give a fallback ({{{ref.key}|<default>}}), or narrow "
                "the glob"
            )
    return out


def _field_text(value: object, ref: FieldUse, source: Path, index: int) -> str:
    """A field's value as placeholder text: a scalar as written, a list its items joined with
    spaces (not where one value must go: the timeout)."""
    where = f"used by tasks[{index}] as {ref.shown}"
    if isinstance(value, list) and not ref.scalar:
        if all(isinstance(item, str | int | float) for item in value):
            return " ".join(_scalar_text(item) for item in value)
        raise ConfigError(
            f"{source}: field {ref.field!r} is a list of more than strings and numbers ({where});"
            " point at a scalar field or a list of scalars"
        )
    if isinstance(value, str | int | float):
        return _scalar_text(value)
    if isinstance(value, list):
        raise ConfigError(
            f"{source}: field {ref.field!r} is a list, but it is used as the timeout of "
            f"tasks[{index}], which needs one duration; point the timeout at a scalar field"
        )
    raise ConfigError(
        f"{source}: field {ref.field!r} is a {type(value).__name__}, not a string or number "
        f"({where}); point at a scalar field"
    )


def _scalar_text(value: str | int | float) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def instance_timeout(inst: Instance, timeout: str, index: int) -> float:
    """A ``timeout: "{config.<field>}"`` (or ``"{config.<field>|1h}"``) of one matched task,
    as seconds."""
    value = render(timeout, inst.vars)
    source = _matched_config(Path(inst.vars["task_file"]))
    match = CONFIG_REF.search(timeout)
    field = match.group(1)[len(CONFIG_PREFIX) :] if match else timeout
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(
            f"{source}: field {field!r} is used as the timeout of tasks[{index}]: {exc}"
        ) from None


def instances(
    entry: TaskEntry,
    index: int,
    base_dir: Path,
    loc: Locator,
    tasks_root: Path | None = None,
    fields: list[FieldUse] | None = None,
) -> list[Instance]:
    if entry.matrix is not None:
        return _matrix_instances(entry, index, loc)
    if entry.glob is not None:
        root = base_dir if tasks_root is None else tasks_root
        return _glob_instances(entry, index, base_dir, loc, root, fields or [])
    name = render(entry.name, {}) if entry.name is not None else default_name(entry.command)
    return [Instance(name, {}, f"tasks[{index}]")]
