"""Expand the entries of ``tasks:`` (explicit, ``glob:``, ``matrix:``) into :class:`TaskSpec` s.

An entry's instances (a matrix combination, a glob match) are ``instances.py``, and which of
two specs with one id stands is ``taskids.py``; this module checks each entry's fields and
templates and makes the specs. Everything here raises :class:`ConfigError` located with a
:class:`Locator` (file, line, field).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from gpuswarm.config import deps
from gpuswarm.config.agents import agent_command, agent_usage, merge_agent
from gpuswarm.config.instances import (
    MAX_TASKS,
    FieldUse,
    Instance,
    config_refs,
    expanded_path,
    instance_timeout,
    instances,
    tasks_root_of,
)
from gpuswarm.config.models import (
    RunConfig,
    TaskEntry,
    TaskOptions,
    TaskSpec,
)
from gpuswarm.config.repeats import REPEAT, repeat_fields, repeated
from gpuswarm.config.shellsyntax import shell_syntax, unclosed_quote
from gpuswarm.config.taskids import keeps_first, refuse_duplicate, same_folder
from gpuswarm.config.values import check_name_size, parse_duration
from gpuswarm.config.yamlload import Locator, PathKey, format_path, shorten
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.paths import check_task_id, slugify
from gpuswarm.core.placeholders import (
    CONFIG_PREFIX,
    GLOB_VARS,
    PLACEHOLDERS_AT_LAUNCH,
    PLACEHOLDERS_AT_LOAD,
    render,
    shell_split,
    unknown_placeholders,
    uses_placeholder,
)
from gpuswarm.core.redact import Redactor, name_redactor


def task_id_for(name: str) -> str:
    """The task id of a task name: a slug that always passes :func:`check_task_id`."""
    return check_task_id(slugify(name).lstrip("._-") or "task")


def merge_options(defaults: TaskOptions, entry: TaskOptions) -> TaskOptions:
    """``defaults`` overridden by the fields ``entry`` sets; env dicts merge (entry wins), and
    so do the fields of ``agent`` (a task's prompt under the defaults' preset and model)."""
    data = {name: getattr(defaults, name) for name in TaskOptions.model_fields}
    for name in entry.model_fields_set & set(TaskOptions.model_fields):
        data[name] = getattr(entry, name)
    data["env"] = {**defaults.env, **entry.env}
    data["agent"] = merge_agent(defaults.agent, entry.agent)
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
    names: Redactor | None = None,
    config_dir: Path | None = None,
) -> TaskSpec:
    """The :class:`TaskSpec` of one instance (id from its name unless ``task_id`` is given).

    The name is redacted like a command (``names``, else :func:`name_redactor` of the task's
    env): by the secret values of this process and of the task's env, and by shape."""
    names = names if names is not None else name_redactor(opts.env)
    name = names.name(instance.name).replace("\0", "")  # an env value cannot hold NUL
    variables = dict(instance.vars)
    templates = [command] if isinstance(command, str) else command
    templates = [*templates, opts.cwd or "", opts.done_when or "", *opts.env.values()]
    if uses_placeholder(templates, "config_dir"):  # only then: other tasks' digests stay
        variables["config_dir"] = str(config_dir or base_dir)
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
        vars=variables,
        skip_exit_code=opts.skip_exit_code,
        skip_reason=instance.skip,
        gpu_memory_mb=opts.gpu_memory,
        accelerator=opts.accelerator,
        group=opts.group,
        **deps.rendered_refs(opts, instance.vars),  # issue 35: resolved to ids by expand_entries
        max_usd=opts.max_usd,
        stall_after=opts.stall_after,
        score=opts.score,
        passed=opts.passed,
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
        quote = unclosed_quote(command)
        if quote is not None:
            raise loc.error(
                path,
                f"a {quote} quote is never closed, so /bin/sh would refuse the command; "
                "fix the quoting",
            )
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


def _check_no_shell(entry: TaskEntry, config: RunConfig, loc: Locator, path: PathKey) -> None:
    """Refuse a command string with shell syntax that no ``shell:`` says how to run: split
    into arguments, its ``|`` or ``>`` would reach the program as plain characters (issue 28).
    ``shell: false`` (on the entry or in defaults) says: split it, characters as they are."""
    if not isinstance(entry.command, str):
        return
    if "shell" in entry.model_fields_set or "shell" in config.defaults.model_fields_set:
        return
    found = shell_syntax(entry.command)
    if found is not None:
        raise loc.error(
            (*path, "command"),
            f"the command uses shell syntax ({found}) but runs without a shell, so the "
            "program would get those characters as plain words; set shell: true to run it "
            "with /bin/sh -c, or write it as a list ([program, arg, ...]) or quote them to "
            "pass them literally",
        )


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
    known = {*PLACEHOLDERS_AT_LAUNCH, *PLACEHOLDERS_AT_LOAD} | var_names
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
                expanded_path(value, loc, origin)
    for key, value in opts.env.items():
        origin = _origin(entry, path, "env", key)
        suffix = used_by if origin[0] == "defaults" else ""
        check_template(value, known, loc, origin, f"the value of {key}{suffix}")


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


def _expand_entry(
    config: RunConfig, index: int, base_dir: Path, loc: Locator
) -> list[tuple[TaskSpec, Instance]]:
    entry, path = config.tasks[index], ("tasks", index)
    opts = merge_options(config.defaults, entry)
    var_names = _var_names(entry) | ({REPEAT} if opts.repeats is not None else set())
    _check_gpus(entry, opts, config, loc, path)
    _check_name(entry, var_names, loc, path)
    _check_templates(entry, opts, var_names, loc, path)
    _check_no_shell(entry, config, loc, path)
    origins = {k: _origin(entry, path, k) for k in deps.DEP_FIELDS}  # issue 35
    deps.check_ref_templates(opts, var_names, loc, origins)
    command = split_command(entry.command, opts.shell, loc, (*path, "command"))
    if opts.agent is not None:  # the agent over the task folder, then the command (issue 20)
        command, opts = agent_command(
            opts, command, loc, path, var_names, backend=config.backend, base_dir=base_dir,
            own=entry.agent,
        )  # fmt: skip
    fields = config_refs(entry, opts)
    if fields and entry.glob is None:
        opts, fields = _without_matched_config(entry, opts, fields, loc, path), []
    root = tasks_root_of(config, base_dir)
    out = []
    names = name_redactor(opts.env)  # one per entry: its instances share the env
    opts = deps.with_entry_group(opts, entry, index, loc, path, config.groups, names)
    usage = agent_usage(opts.agent, config.pricing) if opts.agent is not None else None
    for inst in repeated(instances(entry, index, base_dir, loc, root, fields), opts.repeats):
        try:
            check_name_size(inst.name, f"the name of {shorten(inst.label, 80)}")
        except ValueError as exc:
            raise loc.error((*path, "name") if entry.name else path, str(exc)) from None
        own = opts
        if isinstance(opts.timeout, str):
            timeout = instance_timeout(inst, opts.timeout, index)
            own = opts.model_copy(update={"timeout": timeout})
        spec = make_spec(inst, command, own, grace=config.grace, base_dir=base_dir, names=names)
        spec = deps.group_priority(spec, config.groups, "priority" in entry.model_fields_set)
        if usage is not None:
            spec = spec.model_copy(update={"usage": usage})
        if opts.repeats is not None:  # issue 34: which repeat of which task
            spec = spec.model_copy(update=repeat_fields(inst, task_id_for))
        out.append((spec, inst))
    return out


def _without_matched_config(
    entry: TaskEntry, opts: TaskOptions, fields: list[FieldUse], loc: Locator, path: PathKey
) -> TaskOptions:
    """A task no glob matched has no config.yaml: a ``timeout: "{config.<field>|1h}"`` (from
    ``defaults``, say) is its fallback; one without a fallback is refused."""
    required = [f for f in fields if f.required]
    if required or not isinstance(opts.timeout, str):
        raise loc.error(
            _origin(entry, path, "timeout") if isinstance(opts.timeout, str) else path,
            f"{(required or fields)[0].shown} reads the config.yaml a glob: entry matched; only "
            "glob tasks can use it (elsewhere, a fallback: {config.<field>|1h} is the value)",
        )
    return opts.model_copy(update={"timeout": parse_duration(render(opts.timeout, {}))})


def expand_entries(
    config: RunConfig, base_dir: Path, loc: Locator, *, known: Collection[str] = frozenset()
) -> list[TaskSpec]:
    """All tasks of ``config`` in file order; refuses duplicate ids and oversized expansions,
    and dependencies on no task or in a cycle (``known``: ids a run has, for ``add``).

    Globs that select one folder under one id give one task: the same settings are one task,
    a folder one entry excludes is the other's, and other settings are refused (issue 28)."""
    specs: list[TaskSpec] = []
    seen: dict[str, tuple[Instance, PathKey, int]] = {}  # id -> instance, entry, index in specs
    for index, entry in enumerate(config.tasks):
        path: PathKey = ("tasks", index)
        for spec, inst in _expand_entry(config, index, base_dir, loc):
            found = seen.get(spec.id)
            if found is None:
                seen[spec.id] = (inst, path, len(specs))
                specs.append(spec)
                continue
            if not same_folder(inst, found[0]):
                refuse_duplicate(spec, inst, found[:2], entry, loc, path)
            if not keeps_first(spec, specs[found[2]], inst, found[1], loc, path):
                specs[found[2]] = spec
                seen[spec.id] = (inst, path, found[2])
        if len(specs) > MAX_TASKS:
            raise loc.error(path, f"the config gives over {MAX_TASKS} tasks; split it")
    return deps.resolve(specs, {tid: found[1] for tid, found in seen.items()}, loc, known=known)
