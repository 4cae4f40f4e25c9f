"""Tasks with ``agent:``: the preset's script as the task's command, and what the run needs for it.

A task entry (or ``defaults:``) with ``agent: claude-code`` (or a mapping, see
:class:`gpuswarm.agents.preset.AgentUse`) runs the agent CLI over the task's folder, then the
entry's ``command`` (its evaluation): :func:`agent_command` makes that one ``/bin/sh`` script.
:func:`with_agents` adds, for the run, what the agents of its tasks need: a private HOME per slot
(``home.isolate``, unless the config sets it to false) with private copies of the agent's login
files that exist on this host, one preflight check per agent (installed, logged in) and, for
``backend: docker``, the agent's variables passed into the containers by name.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuswarm.agents.command import preflight_script, provision_sources, task_script
from gpuswarm.agents.preset import AgentPreset, AgentUse, PromptTemplate
from gpuswarm.agents.pricing import AgentUsage, Price
from gpuswarm.config.backends import plugins
from gpuswarm.config.models import ProvisionEntry, RunConfig, TaskOptions
from gpuswarm.config.yamlload import Locator, PathKey
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.placeholders import (
    CONFIG_PREFIX,
    PLACEHOLDERS_AT_LAUNCH,
    PLACEHOLDERS_AT_LOAD,
    unknown_placeholders,
)

MAX_TEMPLATE_BYTES = 64 << 10  # a prompt template; the task's /bin/sh -c script holds it, and
# one argument of a program is at most 128 KiB (Linux MAX_ARG_STRLEN)
ANY_CONFIG_FIELD = CONFIG_PREFIX + "*"  # in ``known``: a glob entry's {config.<field>} is allowed


def merge_agent(base: AgentUse | None, over: AgentUse | None) -> AgentUse | None:
    """``defaults.agent`` under a task's ``agent``: the fields the task sets win (``env``
    merges); ``agent: NAME`` on a task sets only its preset."""
    if base is None or over is None:
        return over if over is not None else base
    data = {k: getattr(base, k) for k in base.model_fields_set}
    data.update({k: getattr(over, k) for k in over.model_fields_set})
    if base.env and over.env:
        data["env"] = {**base.env, **over.env}
    return AgentUse.model_validate(data)


def resolve_use(use: AgentUse, loc: Locator, path: PathKey) -> AgentPreset:
    """The preset of ``use`` with its overrides; a located ConfigError when it is wrong."""
    try:
        preset = use.resolved()
    except ConfigError as exc:
        raise loc.error((*path, "agent"), str(exc)) from None
    if preset.needs_files and not use.files:
        raise loc.error(
            (*path, "agent"),
            f"{preset.preset} edits only the files named on its command line; list them in "
            "agent.files, e.g. files: [kernel.cu]",
        )
    return preset


def _unknown(template: str, known: set[str]) -> list[str]:
    """The placeholders of ``template`` not in ``known``; a glob entry's ``{config.<field>}``
    (``config.*`` in ``known``) is checked against each matched config when it is read."""
    bad = unknown_placeholders(template, known)
    if ANY_CONFIG_FIELD in known:
        bad = [k for k in bad if not k.startswith(CONFIG_PREFIX)]
    return bad


def _unknown_message(key: str, known: set[str]) -> str:
    names = ", ".join("{" + k + "}" for k in sorted(known))
    only_glob = (
        " ({config.<field>} reads the config.yaml a glob: entry matched: only glob tasks have it)"
        if key.startswith(CONFIG_PREFIX)
        else ""
    )
    return (
        f"unknown placeholder {{{key}}}{only_glob}; known: {names}; write {{{{ and }}}} for "
        "literal braces"
    )


def check_agent_templates(use: AgentUse, known: set[str], loc: Locator, path: PathKey) -> None:
    """Refuse an unknown ``{placeholder}`` in the agent's prompt or folders."""
    for field in ("prompt", "prompt_file", "workdir", "copy_from"):
        value = getattr(use, field)
        bad = _unknown(value, known) if isinstance(value, str) else []
        if bad:
            raise loc.error((*path, "agent", field), _unknown_message(bad[0], known))


def read_template(
    template: PromptTemplate, base_dir: Path, known: set[str], loc: Locator, where: PathKey
) -> str:
    """The text of ``prompt: {template: FILE}``: FILE relative to the config's folder (never
    outside it), a UTF-8 text file of at most :data:`MAX_TEMPLATE_BYTES`, whose placeholders
    are all known. A located ConfigError (exit 2) naming the field otherwise."""
    field = (*where, "template")
    name = template.template
    if not name.strip():
        raise loc.error(field, "is empty; name the prompt's file, e.g. {template: prompt.md}")
    if "{" in name or "}" in name:
        raise loc.error(
            field,
            f"{name!r}: a template is one file for every task of the entry, so its path takes "
            'no placeholders; a file per task, read as it is: prompt_file: "{task_dir}/prompt.md"',
        )
    if name.startswith("~") or Path(name).is_absolute():
        raise loc.error(field, f"{name!r}: write the file's path relative to the config's folder")
    root = base_dir.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise loc.error(field, f"{name!r} is outside the config's folder {root}; keep it there")
    text = _read_bounded(path, name, root, loc, field)
    bad = _unknown(text, known)
    if bad:
        line = text[: max(text.find("{" + bad[0]), 0)].count("\n") + 1
        raise loc.error(field, f"{path}:{line}: {_unknown_message(bad[0], known)}")
    return text


def _read_bounded(path: Path, name: str, root: Path, loc: Locator, field: PathKey) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise loc.error(
            field, f"{name!r}: no such file {path} (the path is relative to the config's folder)"
        ) from None
    except OSError as exc:
        raise loc.error(field, f"{name!r}: cannot open {path} ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise loc.error(field, f"{name!r}: {path} is not a regular file")
        data = os.read(fd, MAX_TEMPLATE_BYTES + 1)  # a regular file: read whole, or bounded
    finally:
        os.close(fd)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise loc.error(
            field,
            f"{name!r}: {path} is larger than {MAX_TEMPLATE_BYTES >> 10} KiB; keep the template "
            "short and let it name the long files the agent reads",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise loc.error(field, f"{name!r}: {path} is not UTF-8 text ({exc.reason})") from None
    if "\0" in text:
        raise loc.error(field, f"{name!r}: {path} holds a NUL byte; it is not a text file")
    return text.removesuffix("\n")  # the prompt file ends with one newline (printf adds it)


def agent_command(
    opts: TaskOptions,
    command: list[str] | str,
    loc: Locator,
    path: PathKey,
    var_names: set[str],
    *,
    backend: str = "local",
    base_dir: Path | None = None,
    own: AgentUse | None = None,
) -> tuple[str, TaskOptions]:
    """The script of a task with ``agent:`` and its options (``shell: true``, the preset's
    variables under the task's own, ``agent.prompt`` the text of its template). In a container
    (``backend: docker``) the program is the preset's as written, found on the image's PATH,
    never a path of this host. ``own``: the entry's own ``agent:`` (a ``prompt:`` it does not
    set came from ``defaults``); a template is relative to ``base_dir``."""
    use = opts.agent
    assert use is not None
    preset = resolve_use(use, loc, path)
    known = {*PLACEHOLDERS_AT_LAUNCH, *PLACEHOLDERS_AT_LOAD} | var_names
    check_agent_templates(use, known, loc, path)
    if use.prompt is None and use.prompt_file is None:
        raise loc.error(
            (*path, "agent"),
            "the agent needs its instructions: add prompt: (the text), prompt: {template: FILE} "
            'or prompt_file: (a file, e.g. "{task_dir}/prompt.md")',
        )
    if isinstance(use.prompt, PromptTemplate):
        mine = own is not None and "prompt" in own.model_fields_set
        where = (*path, "agent", "prompt") if mine else ("defaults", "agent", "prompt")
        text = read_template(use.prompt, base_dir or Path.cwd(), known, loc, where)
        use = use.model_copy(update={"prompt": text})
    here = _on_host(backend)
    script = task_script(use, preset, command, evaluate_shell=opts.shell, here=here)
    env = {**preset.env, **opts.env}
    return script, opts.model_copy(update={"shell": True, "env": env, "agent": use})


def agent_usage(use: AgentUse, pricing: dict[str, Price]) -> AgentUsage | None:
    """What the judge of a task with ``agent:`` reads its usage by (None: the CLI reports
    none); the config's ``pricing:`` travels with it."""
    try:
        preset = use.resolved()
    except ConfigError:
        return None  # agent_command reports it, located
    if preset.usage is None:
        return None
    return AgentUsage(spec=preset.usage, model=preset.model, pricing=dict(pricing))


def _uses(config: RunConfig) -> list[AgentUse]:
    uses = [config.defaults.agent] if config.defaults.agent is not None else []
    uses += [t.agent for t in config.tasks if t.agent is not None]
    return uses


def with_agents(config: RunConfig) -> RunConfig:
    """``config`` with what its tasks' agents need (see the module docstring); unchanged when
    no task has an agent."""
    uses = _uses(config)
    if not uses:
        return config
    presets: dict[str, AgentPreset] = {}
    for use in uses:
        try:
            preset = use.resolved()
        except ConfigError:
            continue  # the task's own expansion reports it, located
        presets.setdefault(preset.model_dump_json(), preset)
    home = config.home
    isolate = home.isolate or "isolate" not in home.model_fields_set
    provision = list(home.provision)
    if isolate:
        taken = {p.dest.strip("/") for p in provision}
        for preset in presets.values():
            for src, dest in provision_sources(preset):
                if dest not in taken:
                    taken.add(dest)
                    provision.append(ProvisionEntry(src=str(src), dest=dest))
    preflight = list(config.preflight)
    for preset in presets.values():
        script = preflight_script(preset, here=_on_host(config.backend))
        if script not in preflight:
            preflight.append(script)
    update: dict[str, object] = {
        "home": home.model_copy(update={"isolate": isolate, "provision": provision}),
        "preflight": preflight,
    }
    block, plugin = config.backend_block(), plugins().get(config.backend)
    if block is not None and plugin is not None and plugin.pass_env is not None:
        names: list[str] = []
        for preset in presets.values():
            names += [n for n in preset.pass_env if n not in names]
        update[config.backend] = plugin.pass_env(block, names)
    return config.model_copy(update=update)


def _on_host(backend: str) -> bool:
    """Whether the backend's attempts see this host's files (not a container's image)."""
    plugin = plugins().get(backend)
    return plugin is None or plugin.runs_on_host
