"""Expand the entries of ``tasks:`` (explicit, ``glob:``, ``matrix:``) into :class:`TaskSpec` s.

Everything here raises :class:`ConfigError` located with a :class:`Locator` (file, line, field).
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
from typing import NoReturn

from gpuswarm.config.models import (
    RunConfig,
    TaskEntry,
    TaskOptions,
    TaskSpec,
    default_name,
    expand_user,
    parse_duration,
)
from gpuswarm.config.yamlload import Locator, PathKey, format_path, load_yaml, quote
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.paths import check_task_id, slugify
from gpuswarm.core.placeholders import (
    CONFIG_PREFIX,
    CONFIG_REF,
    GLOB_VARS,
    PLACEHOLDERS_AT_LAUNCH,
    find_placeholders,
    render,
    shell_split,
    unknown_placeholders,
)
from gpuswarm.core.redact import redact_shapes

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


def task_id_for(name: str) -> str:
    """The task id of a task name: a slug that always passes :func:`check_task_id`."""
    return check_task_id(slugify(name).lstrip("._-") or "task")


def merge_options(defaults: TaskOptions, entry: TaskOptions) -> TaskOptions:
    """``defaults`` overridden by the fields ``entry`` sets; env dicts merge (entry wins)."""
    data = {name: getattr(defaults, name) for name in TaskOptions.model_fields}
    for name in entry.model_fields_set & set(TaskOptions.model_fields):
        data[name] = getattr(entry, name)
    data["env"] = {**defaults.env, **entry.env}
    return TaskOptions.model_construct(**data)


def _origin(entry: TaskEntry, path: PathKey, *field: str) -> PathKey:
    """Where a merged field came from: the entry when it sets it, else ``defaults``."""
    own = entry.env if field[0] == "env" else entry.model_fields_set
    key = field[-1]
    return (*path, *field) if key in own else ("defaults", *field)


def make_spec(
    instance: Instance,
    command: list[str] | str,
    opts: TaskOptions,
    *,
    grace: float,
    base_dir: Path,
    task_id: str | None = None,
) -> TaskSpec:
    """The :class:`TaskSpec` of one instance (id from its name unless ``task_id`` is given).

    The name is redacted by shape (a name made of a command must not carry its token)."""
    name = redact_shapes(instance.name).replace("\0", "")  # an env value cannot hold NUL
    return TaskSpec(
        id=task_id or task_id_for(name),
        name=name,
        command=command,
        shell=opts.shell,
        cwd=_cwd(opts.cwd, base_dir),
        env=dict(opts.env),
        timeout=_resolved_timeout(opts.timeout),
        grace=opts.grace if opts.grace is not None else grace,
        max_attempts=opts.max_attempts,
        priority=opts.priority,
        gpus=opts.gpus,
        done_when=opts.done_when,
        metrics=dict(opts.metrics),
        vars=dict(instance.vars),
        skip_exit_code=opts.skip_exit_code,
        skip_reason=instance.skip,
    )


def _resolved_timeout(timeout: float | str | None) -> float | None:
    if isinstance(timeout, str):  # a {config.field} that no glob match resolved
        raise ConfigError(
            f"timeout {timeout!r}: {{config.<field>}} reads the config.yaml a glob: entry "
            "matched, so only glob tasks can use it; give a duration (90s, 10m, 2h) here"
        )
    return timeout


def _cwd(cwd: str | None, base_dir: Path) -> str | None:
    """Absolute path template: relative paths join ``base_dir``; ``{...}``-first ones are kept."""
    if cwd is None or cwd.startswith("{"):
        return cwd
    path = Path(cwd).expanduser()
    return str(path if path.is_absolute() else base_dir / path)


# -- commands and placeholders ---------------------------------------------------------------------
def split_command(
    command: str | list[str],
    shell: bool,
    loc: Locator,
    path: PathKey,
    *,
    shell_hint: str = "set shell: true",
) -> list[str] | str:
    """The stored command: the string itself with ``shell``, else an argv list (shlex split)."""
    if shell:
        if isinstance(command, list):
            raise loc.error(path, "shell: true needs the command as one string; write it quoted")
        return command
    if isinstance(command, list):
        return list(command)
    try:
        argv = shell_split(command)  # shlex.split's rules, linear time
    except ValueError as exc:
        raise loc.error(
            path,
            f"cannot split the command into arguments ({exc}); fix the quoting, "
            f"or {shell_hint} to run it with /bin/sh -c",
        ) from None
    if not argv:
        raise loc.error(path, "the command is empty; write the program and its arguments")
    return argv


ANY_CONFIG_FIELD = CONFIG_PREFIX + "*"  # in ``known``: a glob entry's {config.<field>} is allowed


def _unknown(template: str, known: set[str]) -> list[str]:
    bad = unknown_placeholders(template, known)
    if ANY_CONFIG_FIELD in known:  # checked against each matched file when it is read
        bad = [k for k in bad if not k.startswith(CONFIG_PREFIX)]
    return bad


def check_template(template: str, known: set[str], loc: Locator, path: PathKey, what: str) -> None:
    """Refuse a ``{placeholder}`` of ``template`` that is not in ``known``."""
    bad = _unknown(template, known)
    if bad:
        names = ", ".join("{" + k + "}" for k in sorted(known))
        raise loc.error(
            path,
            f"unknown placeholder {{{bad[0]}}} in {what}; known placeholders: {names}; "
            "write {{ and }} for literal braces",
        )


def _check_name(entry: TaskEntry, var_names: set[str], loc: Locator, path: PathKey) -> None:
    if entry.name is None:
        return
    for key in _unknown(entry.name, var_names):
        allowed = ", ".join("{" + k + "}" for k in sorted(var_names)) or "none"
        when = " is known only at launch" if key in PLACEHOLDERS_AT_LAUNCH else " is not defined"
        raise loc.error(
            (*path, "name"),
            f"placeholder {{{key}}}{when}; a name is fixed when the config is loaded, so it can "
            f"use only this entry's values ({allowed}); write {{{{ and }}}} for literal braces",
        )


def _check_templates(
    entry: TaskEntry, opts: TaskOptions, var_names: set[str], loc: Locator, path: PathKey
) -> None:
    known = set(PLACEHOLDERS_AT_LAUNCH) | var_names
    used_by = f" (as used by {format_path(path)})"
    command = [entry.command] if isinstance(entry.command, str) else entry.command
    for index, part in enumerate(command):
        where = (*path, "command") if isinstance(entry.command, str) else (*path, "command", index)
        check_template(part, known, loc, where, "the command")
    for field in ("cwd", "done_when"):
        value = getattr(opts, field)
        if value is not None:
            origin = _origin(entry, path, field)
            suffix = used_by if origin[0] == "defaults" else ""
            check_template(value, known, loc, origin, field + suffix)
            if field == "cwd" and not value.startswith("{"):
                _expanded(value, loc, origin)
    for key, value in opts.env.items():
        origin = _origin(entry, path, "env", key)
        suffix = used_by if origin[0] == "defaults" else ""
        check_template(value, known, loc, origin, f"the value of {key}{suffix}")


# -- instances -------------------------------------------------------------------------------------
def _name(template: str | None, values: dict[str, str], prefix: str, suffix: str) -> str:
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
        name = _name(entry.name, values, f"matrix{index}", suffix)
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


def _expanded(text: str, loc: Locator, path: PathKey) -> Path:
    try:
        return expand_user(text)
    except ValueError as exc:
        raise loc.error(path, str(exc)) from None


def _glob_matches(
    pattern: str, base_dir: Path, loc: Locator, path: PathKey
) -> tuple[Path, list[Path]]:
    _expanded(pattern, loc, path)
    root, rest = _split_glob(pattern, base_dir)
    try:
        found = set(root.glob(rest)) if rest and root.is_dir() else set()
    except OSError as exc:
        raise loc.error(
            path, f"cannot search {root}: {exc.strerror}; fix its permissions"
        ) from None
    if not rest and root.exists():
        found = {root}
    if not found:
        missing = "" if root.is_dir() else f" ({root} does not exist)"
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
    fields: list[str],
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
        name = _name(template, values, "", values["task_rel"])
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
def _config_refs(entry: TaskEntry, opts: TaskOptions) -> list[str]:
    """The ``config.<field>`` placeholders an entry uses (command, name, env, cwd, done_when,
    timeout), in order of first use."""
    texts = [entry.command] if isinstance(entry.command, str) else list(entry.command)
    texts += [t for t in (entry.name, opts.cwd, opts.done_when) if t is not None]
    texts += list(opts.env.values())
    if isinstance(opts.timeout, str):
        texts.append(opts.timeout)
    found: list[str] = []
    for text in texts:
        for ref in CONFIG_REF.findall(text):
            if ref not in found:
                found.append(ref)
    return found


def _matched_config(task_file: Path) -> Path:
    """The YAML file a glob task reads ``{config.*}`` from: the matched file when it is YAML,
    else ``config.yaml`` in the matched folder."""
    if task_file.is_file() and task_file.suffix in (".yaml", ".yml"):
        return task_file
    return (task_file if task_file.is_dir() else task_file.parent) / "config.yaml"


def _config_fields(task_file: Path, refs: list[str], index: int) -> dict[str, str]:
    """``{"config.<field>": value}`` for each reference, read from the matched config."""
    if not refs:
        return {}
    source = _matched_config(task_file)
    used = f"used by tasks[{index}] as {{{refs[0]}}}"
    try:
        text = source.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read it ({exc.strerror}), {used}") from None
    data, _ = load_yaml(text, str(source))
    out: dict[str, str] = {}
    for ref in refs:
        value: object = data
        for key in ref[len(CONFIG_PREFIX) :].split("."):
            value = value.get(key) if isinstance(value, dict) else None
        shown = "{" + ref + "}"
        if value is None:
            raise ConfigError(
                f"{source}: has no field {ref[len(CONFIG_PREFIX) :]!r} (used by tasks[{index}] "
                f"as {shown}); add it to that file, or narrow the glob"
            )
        if isinstance(value, bool):
            out[ref] = "true" if value else "false"
        elif isinstance(value, int | float | str):
            out[ref] = str(value)
        else:
            raise ConfigError(
                f"{source}: field {ref[len(CONFIG_PREFIX) :]!r} is a {type(value).__name__}, "
                f"not a string or number (used by tasks[{index}] as {shown}); point at a "
                "scalar field"
            )
    return out


def _instance_timeout(inst: Instance, timeout: str, index: int) -> float:
    """A ``timeout: "{config.<field>}"`` of one matched task, as seconds."""
    value = render(timeout, inst.vars)
    source = _matched_config(Path(inst.vars["task_file"]))
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(
            f"{source}: field {timeout.strip('{}')[len(CONFIG_PREFIX) :]!r} is used as the "
            f"timeout of tasks[{index}]: {exc}"
        ) from None


def _instances(
    entry: TaskEntry,
    index: int,
    base_dir: Path,
    loc: Locator,
    tasks_root: Path | None = None,
    fields: list[str] | None = None,
) -> list[Instance]:
    if entry.matrix is not None:
        return _matrix_instances(entry, index, loc)
    if entry.glob is not None:
        root = base_dir if tasks_root is None else tasks_root
        return _glob_instances(entry, index, base_dir, loc, root, fields or [])
    name = render(entry.name, {}) if entry.name is not None else default_name(entry.command)
    return [Instance(name, {}, f"tasks[{index}]")]


# -- the whole list --------------------------------------------------------------------------------
def _var_names(entry: TaskEntry) -> set[str]:
    if entry.matrix is not None:
        return set(entry.matrix)
    return {*GLOB_VARS, ANY_CONFIG_FIELD} if entry.glob is not None else set()


def _check_gpus(
    entry: TaskEntry, opts: TaskOptions, config: RunConfig, loc: Locator, path: PathKey
) -> None:
    if opts.gpus is not None and opts.gpus > config.gpus_per_task:
        raise loc.error(
            _origin(entry, path, "gpus"),
            f"{opts.gpus} GPUs per task is more than gpus_per_task ({config.gpus_per_task}); "
            f"set gpus_per_task: {opts.gpus} at the top level, or lower gpus",
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


def _expand_entry(
    config: RunConfig, index: int, base_dir: Path, loc: Locator
) -> list[tuple[TaskSpec, Instance]]:
    entry, path = config.tasks[index], ("tasks", index)
    opts = merge_options(config.defaults, entry)
    var_names = _var_names(entry)
    _check_gpus(entry, opts, config, loc, path)
    _check_name(entry, var_names, loc, path)
    _check_templates(entry, opts, var_names, loc, path)
    command = split_command(entry.command, opts.shell, loc, (*path, "command"))
    fields = _config_refs(entry, opts)
    if fields and entry.glob is None:
        raise loc.error(
            _origin(entry, path, "timeout") if isinstance(opts.timeout, str) else path,
            f"{{{fields[0]}}} reads the config.yaml a glob: entry matched; only glob tasks can "
            "use it",
        )
    root = tasks_root_of(config, base_dir)
    instances = _instances(entry, index, base_dir, loc, root, fields)
    out = []
    for inst in instances:
        own = opts
        if isinstance(opts.timeout, str):
            timeout = _instance_timeout(inst, opts.timeout, index)
            own = opts.model_copy(update={"timeout": timeout})
        out.append((make_spec(inst, command, own, grace=config.grace, base_dir=base_dir), inst))
    return out


def expand_entries(config: RunConfig, base_dir: Path, loc: Locator) -> list[TaskSpec]:
    """All tasks of ``config`` in file order; refuses duplicate ids and oversized expansions."""
    specs: list[TaskSpec] = []
    seen: dict[str, tuple[Instance, PathKey]] = {}
    for index, entry in enumerate(config.tasks):
        for spec, inst in _expand_entry(config, index, base_dir, loc):
            if spec.id in seen:
                if _same_folder(inst, seen[spec.id][0]):
                    continue  # overlapping globs: one task per folder (the first entry's)
                _duplicate(spec, inst, seen[spec.id], entry, loc, ("tasks", index))
            seen[spec.id] = (inst, ("tasks", index))
            specs.append(spec)
        if len(specs) > MAX_TASKS:
            raise loc.error(("tasks", index), f"the config gives over {MAX_TASKS} tasks; split it")
    return specs


def _same_folder(a: Instance, b: Instance) -> bool:
    return bool(a.unit) and a.unit == b.unit


def _duplicate(
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
