"""``gpuswarm agents``: the agent presets, what one expands to, and whether it is ready here.

- ``gpuswarm agents``: each preset, its CLI and whether that is installed;
- ``gpuswarm agents show NAME|FILE [--model M] [--effort E]``: its command line, the files of
  its login it would copy into a slot's HOME (found or not), its variables and its check;
- ``gpuswarm agents check NAME|FILE...``: run each one's preflight here (installed? logged
  in?); exit 2 when one is not ready.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, TypedDict

import click

from gpuswarm.agents.command import agent_argv, find_program, provision_sources
from gpuswarm.agents.preset import CUSTOM, AgentPreset, AgentStatus, preset_names, shipped_preset
from gpuswarm.core.errors import ResearchError
from gpuswarm.research.agent import check_agent, load_preset
from gpuswarm.research.clikit import emit, handle_errors


class PresetRow(TypedDict):
    preset: str
    program: str
    found: str | None  # where its CLI is, None: not installed
    description: str


class PresetList(TypedDict):
    presets: list[PresetRow]


class ProvisionJson(TypedDict):
    src: str
    dest: str
    found: bool


class StatusJson(TypedDict):
    """An :class:`AgentStatus` as JSON (its fields in order)."""

    argv: list[str]
    expect: str | None
    env_any: list[str]
    files_any: list[str]
    hint: str


class PresetJson(TypedDict):
    """``agents show --json``."""

    preset: str
    argv: list[str]
    prompt: Literal["arg", "file", "stdin"]
    timeout: float
    env: dict[str, str]
    pass_env: dict[str, bool]  # a variable passed by name -> set here
    provision: list[ProvisionJson]
    status: StatusJson
    install: str
    program_found: str | None


class CheckRow(TypedDict):
    agent: str
    ready: bool
    report: str


class CheckList(TypedDict):
    agents: list[CheckRow]


def status_json(status: AgentStatus) -> StatusJson:
    return {
        "argv": list(status.argv),
        "expect": status.expect,
        "env_any": list(status.env_any),
        "files_any": list(status.files_any),
        "hint": status.hint,
    }


@click.group("agents", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.pass_context
@handle_errors
def agents(ctx: click.Context, as_json: bool) -> None:
    """Coding-agent CLIs as workers: the presets (docs/agents.md)."""
    if ctx.invoked_subcommand is not None:
        return
    rows: list[PresetRow] = []
    for name in preset_names():
        if name == CUSTOM:
            continue
        preset = shipped_preset(name)
        rows.append(
            {"preset": name, "program": preset.program, "found": find_program(preset),
             "description": preset.description}
        )  # fmt: skip
    emit(as_json, PresetList(presets=rows), _show_list)


def _show_list(data: PresetList) -> None:
    for row in data["presets"]:
        where = row["found"] or "not installed"
        click.echo(f"{row['preset']:<12} {row['program']:<13} {where:<32} {row['description']}")


def _describe(preset: AgentPreset) -> PresetJson:
    argv = agent_argv(
        preset,
        find_program(preset) or preset.program,
        workdir="<workdir>",
        prompt="<prompt>",
        prompt_file="<prompt file>",
        files=["<files>"] if "{files}" in preset.args else [],
    )
    found = {dest for _, dest in provision_sources(preset)}
    return {
        "preset": preset.preset,
        "argv": argv,
        "prompt": preset.prompt_via,
        "timeout": preset.timeout,
        "env": preset.env,
        "pass_env": {name: name in os.environ for name in preset.pass_env},
        "provision": [
            {"src": p.src, "dest": p.dest, "found": p.dest in found} for p in preset.provision
        ],
        "status": status_json(preset.status),
        "install": preset.install,
        "program_found": find_program(preset),
    }


def _show_one(data: PresetJson) -> None:
    quoted = " ".join(a if a and " " not in a else repr(a) for a in data["argv"])
    click.echo(f"{data['preset']}: {quoted}")
    via = {"stdin": "on its standard input", "arg": "as one argument", "file": "in a file"}
    click.echo(f"  prompt: {via[data['prompt']]}; timeout {data['timeout']:g}s")
    if not data["program_found"]:
        click.echo(f"  not installed here; install: {data['install']}")
    for item in data["provision"]:
        mark = "copied" if item["found"] else "absent"
        click.echo(f"  login file ({mark}): {item['src']} -> ~/{item['dest']}")
    for name, value in data["env"].items():
        click.echo(f"  sets {name}={value}")
    shown = [f"{n}{'' if is_set else ' (unset)'}" for n, is_set in data["pass_env"].items()]
    click.echo(f"  passes by name: {', '.join(shown) or '-'}")
    status = data["status"]
    if status["argv"]:
        click.echo(f"  check: {Path(data['argv'][0]).name} {' '.join(status['argv'])}")
    if status["env_any"] or status["files_any"]:
        alt = [*status["env_any"], *(f"~/{f}" for f in status["files_any"])]
        click.echo(f"  logged in also when: {', '.join(alt)}")


@agents.command("show")
@click.argument("name")
@click.option("--model", help="the model to pass")
@click.option("--effort", help="the effort level to pass")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@handle_errors
def show(name: str, model: str | None, effort: str | None, as_json: bool) -> None:
    """What preset NAME (or a preset FILE) runs, copies, passes and checks."""
    emit(as_json, _describe(load_preset(name, model=model, effort=effort)), _show_one)


def _show_checks(data: CheckList) -> None:
    for row in data["agents"]:
        click.echo(row["report"])


@agents.command("check")
@click.argument("names", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@handle_errors
def check(names: tuple[str, ...], as_json: bool) -> None:
    """Is each agent installed and logged in here? Exit 2 when one is not."""
    results: list[CheckRow] = []
    for name in names:
        try:
            results.append({"agent": name, "ready": True, "report": check_agent(load_preset(name))})
        except ResearchError as exc:
            results.append({"agent": name, "ready": False, "report": str(exc)})
    emit(as_json, CheckList(agents=results), _show_checks)
    if not all(r["ready"] for r in results):
        raise SystemExit(2)
