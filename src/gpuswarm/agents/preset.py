"""Agent presets: what one coding agent's CLI needs to run unattended, as data.

A preset (``presets/<name>.yaml``, shipped with the package) says how to run the CLI without a
person: its program, the non-interactive arguments (``{prompt}``, ``{prompt_file}``,
``{workdir}``, ``{files}`` and ``{options}`` placeholders), how a model and an effort level are
passed, the variables it needs (set ones in ``env``, API keys passed through by name in
``pass_env``), the files of the user's login copied into a private HOME (``provision``) and how
to tell that it is installed and logged in (``status``). :class:`AgentUse` is what a user writes:
a preset's name and any field of it to override, or ``preset: custom`` with their own program.

Placeholders of the argument lists:

- ``{prompt}``: the prompt's text as one argument (a whole word);
- ``{prompt_file}``: the path of a file holding the prompt;
- neither: the prompt is fed on the agent's standard input;
- ``{workdir}``: the folder the agent works in (it also runs there);
- ``{files}``: the files to edit, one argument each (a whole word; aider needs them);
- ``{options}``: where ``model_args``, ``effort_args`` and ``extra_args`` go (default: the end);
- ``{model}``, ``{effort}``: in ``model_args`` / ``effort_args``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpuswarm.agents.usage import UsageSpec
from gpuswarm.core.errors import ConfigError

_STRICT = ConfigDict(extra="forbid", strict=True)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([dhms])")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
MAX_TIMEOUT = 7 * 86400.0
DEFAULT_TIMEOUT = 3600.0  # AgentKernelArena's agents: timeout_seconds 3600

#: Placeholders of ``args`` (and where they may stand).
WHOLE_WORD = ("{prompt}", "{files}", "{options}")
ARG_PLACEHOLDERS = ("prompt", "prompt_file", "workdir", "files", "options")
CUSTOM = "custom"


def parse_seconds(value: object) -> float:
    """Seconds from ``900``, ``"90s"``, ``"15m"``, ``"1h30m"``; ValueError saying how otherwise."""
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 32:
        text = value.strip()
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        else:
            parts = list(_DURATION.finditer(text))
            if parts and "".join(p.group(0) for p in parts).strip() == text.replace(" ", ""):
                seconds = sum(float(p.group(1)) * _UNITS[p.group(2)] for p in parts)
    if seconds is None or not 0 < seconds <= MAX_TIMEOUT:
        raise ValueError(f"{value!r} is not a duration of at most 7d; write 900, 90s, 15m or 2h")
    return seconds


Seconds = Annotated[float, BeforeValidator(parse_seconds)]


def _env_names(names: list[str]) -> list[str]:
    for name in names:
        if not _IDENT.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    return names


EnvNames = Annotated[list[str], BeforeValidator(_env_names)]


class PresetFile(BaseModel):
    """A file of the user's home (``src``, ``~`` allowed) copied to ``dest`` of the slot HOME."""

    model_config = _STRICT

    src: str
    dest: str


class AgentStatus(BaseModel):
    """How to tell the agent is logged in. The first that holds is enough: a variable of
    ``env_any`` is set, a file of ``files_any`` exists under HOME, ``argv`` (arguments of the
    program) exits 0 and its output matches ``expect`` (an extended regular expression, grep -E)."""

    model_config = _STRICT

    argv: list[str] = Field(default_factory=list)
    expect: str | None = None
    env_any: EnvNames = Field(default_factory=list)
    files_any: list[str] = Field(default_factory=list)
    hint: str = ""


class AgentPreset(BaseModel):
    """One agent CLI, resolved: a shipped preset with the user's overrides applied."""

    model_config = _STRICT

    preset: str
    description: str = ""
    program: str
    find: list[str] = Field(default_factory=list)  # other places to look (~ allowed)
    install: str = ""  # how to install it (shown when it is missing)
    args: list[str]
    model: str | None = None
    model_args: list[str] = Field(default_factory=list)
    effort: str | None = None
    effort_args: list[str] = Field(default_factory=list)
    extra_args: list[str] = Field(default_factory=list)
    timeout: Seconds = DEFAULT_TIMEOUT
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: EnvNames = Field(default_factory=list)
    provision: list[PresetFile] = Field(default_factory=list)
    status: AgentStatus = Field(default_factory=AgentStatus)
    needs_files: bool = False  # the CLI edits only the files named on its command line
    # its answer (the change's description) is the first line of its standard output after the
    # last line matching message_after (an aider run prints its set-up first), skipping lines
    # that match message_skip (its notes); None: the first line
    message_after: str | None = None
    message_skip: str | None = None
    # how its CLI reports tokens and cost (agents/usage.py); None: it reports none
    usage: UsageSpec | None = None

    @model_validator(mode="after")
    def _checked(self) -> AgentPreset:
        if not self.program.strip():
            raise ValueError("program is empty; give the agent's executable (a name or a path)")
        for word in self.args:
            for token in WHOLE_WORD:
                if token in word and word != token:
                    raise ValueError(
                        f"args: {token} must be a whole argument, not part of {word!r}"
                    )
        if "{prompt}" in self.args and "{prompt_file}" in " ".join(self.args):
            raise ValueError("args: use {prompt} or {prompt_file}, not both")
        _env_names(list(self.env))
        if self.model is not None and not self.model_args:
            raise ValueError(f"{self.preset} takes no model option (model_args is empty)")
        for key in ("message_after", "message_skip"):
            try:
                re.compile(getattr(self, key) or "")
            except re.error as exc:
                raise ValueError(f"{key} is not a regular expression: {exc}") from None
        if self.effort is not None and not self.effort_args:
            raise ValueError(
                f"{self.preset} has no effort option (effort_args is empty); remove effort"
            )
        return self

    @property
    def prompt_via(self) -> Literal["arg", "file", "stdin"]:
        if "{prompt}" in self.args:
            return "arg"
        if any("{prompt_file}" in a for a in self.args):
            return "file"
        return "stdin"

    def options(self) -> list[str]:
        """The model, effort and extra arguments, rendered."""
        out: list[str] = []
        if self.model is not None:
            out += [a.replace("{model}", self.model) for a in self.model_args]
        if self.effort is not None:
            out += [a.replace("{effort}", self.effort) for a in self.effort_args]
        return out + list(self.extra_args)


class PromptTemplate(BaseModel):
    """``prompt: {template: prompt.md}``: the prompt is this file (relative to the config's
    folder), its placeholders (``{config.<field>}``, ``{task_dir}``...) rendered per task."""

    model_config = _STRICT

    template: str


def _prompt_value(value: object) -> object:
    if isinstance(value, dict):
        if set(value) != {"template"} or not isinstance(value["template"], str):
            raise ValueError(
                "prompt is the text, or {template: FILE} (a file of the config's folder, e.g. "
                "{template: prompt.md}); got a mapping with " + ", ".join(map(str, value))
            )
        return PromptTemplate(template=value["template"])
    return value


def _as_use(value: object) -> object:
    if isinstance(value, str):
        return {"preset": value}
    return value


class AgentUse(BaseModel):
    """``agent:`` as a user writes it: ``claude-code``, or a mapping with ``preset:`` (default
    ``custom``: then ``program`` and ``args`` are required) and any preset field to override,
    plus what one batch task needs (its prompt, the folder the agent works in)."""

    model_config = _STRICT

    preset: str = CUSTOM
    # any preset field (None: the preset's own)
    description: str | None = None
    program: str | None = None
    find: list[str] | None = None
    install: str | None = None
    args: list[str] | None = None
    model: str | None = None
    model_args: list[str] | None = None
    effort: str | None = None
    effort_args: list[str] | None = None
    extra_args: list[str] | None = None
    timeout: Seconds | None = None
    env: dict[str, str] | None = None  # merged over the preset's env
    pass_env: EnvNames | None = None  # added to the preset's
    provision: list[PresetFile] | None = None  # added to the preset's
    status: AgentStatus | None = None
    needs_files: bool | None = None
    message_after: str | None = None
    message_skip: str | None = None
    usage: UsageSpec | None = None
    # batch tasks
    # the prompt's text, or {template: FILE}: a file of the config's folder (placeholders of
    # both are rendered per task at launch)
    prompt: Annotated[str | PromptTemplate | None, BeforeValidator(_prompt_value)] = None
    prompt_file: str | None = None  # or a file holding it (a path; placeholders allowed)
    workdir: str | None = None  # where the agent works (default: the task's cwd)
    copy_from: str | None = None  # copied into workdir before each attempt (e.g. {task_dir})
    files: list[str] = Field(default_factory=list)  # files to edit ({files}; aider needs them)
    on_failure: Literal["stop", "evaluate"] = "stop"  # a failed agent: fail the attempt or not

    @model_validator(mode="after")
    def _one_prompt(self) -> AgentUse:
        if self.prompt is not None and self.prompt_file is not None:
            raise ValueError("give prompt: or prompt_file:, not both")
        return self

    def resolved(self) -> AgentPreset:
        """The shipped preset with this use's overrides; ConfigError naming the field."""
        return resolve(self)


AgentUseField = Annotated[AgentUse, BeforeValidator(_as_use)]

_OVERRIDES = (
    "description", "program", "find", "install", "args", "model", "model_args", "effort",
    "effort_args", "extra_args", "timeout", "status", "needs_files", "message_after",
    "message_skip", "usage",
)  # fmt: skip
_ADDED = ("pass_env", "provision")


# -- the shipped presets ---------------------------------------------------------------------
def preset_names() -> list[str]:
    """Names of the shipped presets (``custom`` among them)."""
    folder = resources.files("gpuswarm.agents") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


@cache
def _shipped(name: str) -> Mapping[str, object]:
    """The fields of a shipped preset's YAML, as written (AgentPreset validates them once a
    use's overrides are over them); read-only: it is cached."""
    if not _NAME.match(name) or name not in preset_names():
        raise ConfigError(
            f"agent {name!r} is not a preset; use one of {', '.join(preset_names())} "
            "(custom: give program and args yourself)"
        )
    text = (resources.files("gpuswarm.agents") / "presets" / f"{name}.yaml").read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or data.get("preset") != name:
        raise ConfigError(f"the shipped preset {name}.yaml is broken (its preset: must be {name})")
    return data


def shipped_preset(name: str) -> AgentPreset:
    """A shipped preset as it is (``custom`` cannot be used without a program and args)."""
    return resolve(AgentUse(preset=name))


def resolve(use: AgentUse) -> AgentPreset:
    data = dict(_shipped(use.preset))
    for key in _OVERRIDES:
        value = getattr(use, key)
        if value is not None:
            data[key] = value.model_dump() if isinstance(value, BaseModel) else value
    env = data.get("env", {})
    if isinstance(env, dict):  # else AgentPreset refuses it below
        data["env"] = {**env, **(use.env or {})}
    for key in _ADDED:
        extra, shipped = getattr(use, key), data.get(key, [])
        if extra and isinstance(shipped, list):  # else AgentPreset refuses it below
            mine = [x.model_dump() if isinstance(x, BaseModel) else x for x in extra]
            data[key] = [*shipped, *mine]
    if use.preset == CUSTOM and (not data.get("program") or not data.get("args")):
        raise ConfigError(
            "agent: preset custom needs program: (the CLI) and args: (its non-interactive "
            "arguments, e.g. [-p, '{prompt}']); or name a preset: "
            + ", ".join(n for n in preset_names() if n != CUSTOM)
        )
    try:
        return AgentPreset.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"agent {use.preset}: {where + ': ' if where else ''}{msg}") from None
