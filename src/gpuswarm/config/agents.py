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

from gpuswarm.agents.command import preflight_script, provision_sources, task_script
from gpuswarm.agents.preset import AgentPreset, AgentUse
from gpuswarm.config.models import ProvisionEntry, RunConfig, TaskOptions
from gpuswarm.config.yamlload import Locator, PathKey
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.placeholders import PLACEHOLDERS_AT_LAUNCH, unknown_placeholders


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


def check_agent_templates(use: AgentUse, known: set[str], loc: Locator, path: PathKey) -> None:
    """Refuse an unknown ``{placeholder}`` in the agent's prompt or folders."""
    for field in ("prompt", "prompt_file", "workdir", "copy_from"):
        value = getattr(use, field)
        bad = [] if value is None else unknown_placeholders(value, known)
        if bad:
            names = ", ".join("{" + k + "}" for k in sorted(known))
            raise loc.error(
                (*path, "agent", field),
                f"unknown placeholder {{{bad[0]}}}; known: {names}; write {{{{ and }}}} for "
                "literal braces",
            )


def agent_command(
    opts: TaskOptions,
    command: list[str] | str,
    loc: Locator,
    path: PathKey,
    var_names: set[str],
    *,
    backend: str = "local",
) -> tuple[str, TaskOptions]:
    """The script of a task with ``agent:`` and its options (``shell: true``, the preset's
    variables under the task's own). In a container (``backend: docker``) the program is the
    preset's as written, found on the image's PATH, never a path of this host."""
    use = opts.agent
    assert use is not None
    preset = resolve_use(use, loc, path)
    check_agent_templates(use, set(PLACEHOLDERS_AT_LAUNCH) | var_names, loc, path)
    if use.prompt is None and use.prompt_file is None:
        raise loc.error(
            (*path, "agent"),
            "the agent needs its instructions: add prompt: (the text) or prompt_file: (a file, "
            'e.g. "{task_dir}/prompt.md")',
        )
    here = backend != "docker"
    script = task_script(use, preset, command, evaluate_shell=opts.shell, here=here)
    env = {**preset.env, **opts.env}
    return script, opts.model_copy(update={"shell": True, "env": env})


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
        script = preflight_script(preset, here=config.backend != "docker")
        if script not in preflight:
            preflight.append(script)
    update: dict[str, object] = {
        "home": home.model_copy(update={"isolate": isolate, "provision": provision}),
        "preflight": preflight,
    }
    if config.docker is not None:
        names = list(config.docker.pass_env)
        for preset in presets.values():
            names += [n for n in preset.pass_env if n not in names]
        update["docker"] = config.docker.model_copy(update={"pass_env": names})
    return config.model_copy(update=update)
