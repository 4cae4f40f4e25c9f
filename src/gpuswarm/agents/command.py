"""What a preset expands to: the agent's argv, a batch task's shell script (the agent over the
task folder, then the task's evaluation), the preflight check (installed? logged in?) and the
files of the user's login to copy into a slot's private HOME.

Nothing here runs anything: the research proposer runs :func:`invocation`, the supervisor runs
the scripts through the run's backend (so they run in the slot's container too).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.agents.answer import answer_text
from gpuswarm.agents.preset import AgentPreset, AgentUse, PromptTemplate

STATUS_TIMEOUT = 60  # seconds a login check may take
KILL_AFTER = 10  # seconds between the agent's TERM at its timeout and its KILL
PROMPT_NAME = ".agent-prompt.md"  # a batch task's prompt, kept in its workspace


def find_program(preset: AgentPreset, path: str | None = None) -> str | None:
    """The agent's executable: a name found on PATH stays a name (it resolves the same in a slot
    or container), else the first existing ``find`` place or the configured path, absolute;
    None when it is nowhere."""
    program = str(Path(preset.program).expanduser())
    if "/" in program:
        return program if os.access(program, os.X_OK) and Path(program).is_file() else None
    if shutil.which(program, path=path) is not None:
        return program
    for place in preset.find:
        candidate = str(Path(place).expanduser())
        if os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    return None


def program_for(preset: AgentPreset, *, here: bool = True) -> str:
    """The program to run: where it was found, else as configured (its preflight says).
    ``here=False`` (the agent runs in a container): as configured, never a path of this host."""
    found = find_program(preset) if here else None
    return found or str(Path(preset.program).expanduser())


def agent_argv(
    preset: AgentPreset,
    program: str,
    *,
    workdir: str,
    prompt: str | None = None,
    prompt_file: str | None = None,
    files: Sequence[str] = (),
) -> list[str]:
    """``[program, *args]`` with the placeholders filled: ``{prompt}`` is ``prompt``,
    ``{prompt_file}`` is ``prompt_file``, ``{files}`` are ``files``."""
    out = [program]
    args = list(preset.args)
    if "{options}" not in args:
        args.append("{options}")
    for word in args:
        if word == "{options}":
            out += preset.options()
        elif word == "{files}":
            out += list(files)
        elif word == "{prompt}":
            out.append(prompt if prompt is not None else "")
        else:
            text = word.replace("{workdir}", workdir)
            if prompt_file is not None:
                text = text.replace("{prompt_file}", prompt_file)
            out.append(text)
    return out


@dataclass(frozen=True)
class Invocation:
    """One run of the agent: its argv, its standard input (the prompt file, or nothing) and the
    variables set for it."""

    argv: list[str]
    stdin: Path | None
    env: dict[str, str]
    timeout: float


def invocation(
    preset: AgentPreset, *, workdir: Path, prompt_file: Path, files: Sequence[str] = ()
) -> Invocation:
    """How the research proposer runs the agent in ``workdir`` on the prompt in ``prompt_file``."""
    via = preset.prompt_via
    text = prompt_file.read_text() if via == "arg" else None
    argv = agent_argv(
        preset,
        program_for(preset),
        workdir=str(workdir),
        prompt=text,
        prompt_file=str(prompt_file),
        files=files,
    )
    stdin = prompt_file if via == "stdin" else None
    return Invocation(argv, stdin, dict(preset.env), preset.timeout)


# -- a batch task ------------------------------------------------------------------------------
def _q(word: str) -> str:
    """A word quoted for /bin/sh; launch placeholders inside stay (the shell renderer quotes
    their values in place)."""
    return shlex.quote(word)


def task_script(
    use: AgentUse,
    preset: AgentPreset,
    evaluate: list[str] | str,
    *,
    evaluate_shell: bool,
    here: bool = True,
) -> str:
    """The ``/bin/sh`` script of a task with ``agent:``: write the prompt into the workspace,
    copy the task folder in (``copy_from``), run the agent in its workdir under its timeout, then
    the task's own evaluation command (in the task's cwd). The agent works in ``workdir``
    (default: the task's cwd). Launch placeholders (``{workspace}``, ``{task_dir}``...)
    stay in it: the launch renders them quoted."""
    prompt_path = "{workspace}/" + PROMPT_NAME
    name = preset.preset
    workdir = '"$PWD"' if use.workdir is None else _q(use.workdir)  # default: the task's cwd
    lines = ["set -u", f"gs_prompt={_q(prompt_path)}", f"gs_workdir={workdir}"]
    if isinstance(use.prompt, PromptTemplate):
        raise ValueError("a prompt template is read first (its text is the prompt)")
    if use.prompt is not None:
        lines.append(f"printf '%s\\n' {_q(use.prompt)} > \"$gs_prompt\" || exit 2")
    elif use.prompt_file is not None:
        why = _q(f"gpuswarm agent: cannot read prompt_file {use.prompt_file}")
        lines.append(
            f'cat -- {_q(use.prompt_file)} > "$gs_prompt" || {{ echo {why} >&2; exit 2; }}'
        )
    else:
        raise ValueError("a batch agent needs prompt or prompt_file")
    if use.copy_from is not None:
        why = _q(f"gpuswarm agent: cannot copy {use.copy_from} into the workdir")
        src = _q(use.copy_from.rstrip("/") + "/.")
        lines.append(
            f'mkdir -p -- "$gs_workdir" && cp -pR -- {src} "$gs_workdir/" || '
            f"{{ echo {why} >&2; exit 2; }}"
        )
    program = program_for(preset, here=here)
    words = agent_argv(
        preset,
        program,
        workdir="\0WORKDIR\0",
        prompt="\0PROMPT\0",
        prompt_file="\0PROMPTFILE\0",
        files=use.files,
    )
    argv = " ".join(_shell_word(w) for w in words)
    stdin = ' < "$gs_prompt"' if preset.prompt_via == "stdin" else " < /dev/null"
    seconds = int(preset.timeout)
    lines += [
        f"if command -v timeout >/dev/null 2>&1; then set -- timeout -k {KILL_AFTER} {seconds}; "
        "else set --; fi",
        f'echo "gpuswarm agent: {name} in $gs_workdir" >&2',
        f'(cd -- "$gs_workdir" && exec "$@" {argv}){stdin}',
        "gs_rc=$?",
        f'if [ "$gs_rc" -eq 124 ]; then echo "gpuswarm agent: {name} ran past {seconds}s" >&2; '
        f'elif [ "$gs_rc" -ne 0 ]; then echo "gpuswarm agent: {name} exited $gs_rc" >&2; fi',
    ]
    if use.on_failure == "stop":
        lines.append('[ "$gs_rc" -eq 0 ] || exit "$gs_rc"')
    if isinstance(evaluate, str) and evaluate_shell:
        lines.append(evaluate)
    else:
        cmd = shlex.split(evaluate) if isinstance(evaluate, str) else evaluate
        lines.append("exec " + " ".join(_q(w) for w in cmd))
    return "\n".join(lines) + "\n"


def _shell_word(word: str) -> str:
    """One agent argument for the script: the markers become shell expansions."""
    if word == "\0PROMPT\0":
        return '"$(cat -- "$gs_prompt")"'
    parts = []
    for i, piece in enumerate(word.split("\0")):
        if i % 2 == 0:
            if piece:
                parts.append(_q(piece))
        elif piece == "WORKDIR":
            parts.append('"$gs_workdir"')
        elif piece == "PROMPTFILE":
            parts.append('"$gs_prompt"')
    return "".join(parts) or "''"


# -- preflight ---------------------------------------------------------------------------------
def preflight_script(preset: AgentPreset, *, here: bool = True) -> str:
    """A ``/bin/sh`` check that the agent is installed and logged in, run once per slot (with
    the slot's HOME and variables) before anything is claimed. It prints what it found and
    exits 0, or names what is missing and how to fix it (exit 127: not installed, 1: no login)."""
    name = preset.preset
    program = program_for(preset, here=here)
    install = f"; install it: {preset.install}" if preset.install else ""
    st = preset.status
    hint = f"; {st.hint}" if st.hint else ""
    lines = [
        f"# agent {name}: is it installed and logged in?",
        f"gs_prog={_q(program)}",
        'if ! command -v -- "$gs_prog" >/dev/null 2>&1; then',
        f"  echo {_q(f'agent {name}: {program} is not installed (not on PATH)')}"
        f"{_q(install + ' (or set the agent program: to its path)')}",
        "  exit 127",
        "fi",
    ]
    for var in st.env_any:
        lines.append(
            f'if [ -n "${{{var}:-}}" ]; then echo {_q(f"agent {name}: {var} is set")}; exit 0; fi'
        )
    for rel in st.files_any:
        lines.append(
            f'if [ -s "$HOME/"{_q(rel)} ]; then echo {_q(f"agent {name}: ~/{rel} found")}; '
            "exit 0; fi"
        )
    if st.argv:
        shown = " ".join([Path(program).name, *st.argv])
        call = " ".join(_q(a) for a in st.argv)
        lines += [
            f"if command -v timeout >/dev/null 2>&1; then set -- timeout {STATUS_TIMEOUT}; "
            "else set --; fi",
            f'gs_out=$("$@" "$gs_prog" {call} 2>&1 < /dev/null)',
            "gs_rc=$?",
            "printf '%s\\n' \"$gs_out\"",
            'if [ "$gs_rc" -ne 0 ]; then',
            f'  echo {_q(f"agent {name}: `{shown}` exited ")}"$gs_rc"{_q(hint)}',
            "  exit 1",
            "fi",
        ]
        if st.expect:
            lines += [
                f"if ! printf '%s\\n' \"$gs_out\" | grep -Eq -- {_q(st.expect)}; then",
                f"  echo {_q(f'agent {name}: `{shown}` does not show a login{hint}')}",
                "  exit 1",
                "fi",
            ]
        lines.append(f"echo {_q(f'agent {name}: logged in')}")
        lines.append("exit 0")
    elif st.env_any or st.files_any:
        what = ", ".join([*st.env_any, *(f"~/{f}" for f in st.files_any)])
        lines += [f"echo {_q(f'agent {name}: no login found (none of {what}){hint}')}", "exit 1"]
    return "\n".join(lines) + "\n"


# -- provisioning ------------------------------------------------------------------------------
def provision_sources(preset: AgentPreset) -> list[tuple[Path, str]]:
    """``(source, dest)`` for each of the preset's login files that exists on this host (the
    others are not the way this user logs in; the preflight says if none is)."""
    out = []
    for item in preset.provision:
        src = Path(item.src).expanduser()
        if src.exists():
            out.append((src, item.dest))
    return out


def answer_line(preset: AgentPreset, stdout: str) -> str:
    """The change's description in what the agent printed: the first non-empty line of its
    standard output (after the last line matching ``message_after``, skipping the paragraphs that
    start with a line matching ``message_skip``: notes the CLI prints, wrapped to its width).
    A CLI that prints JSON (its ``usage`` format says): the answer inside it."""
    structured = answer_text(preset.usage.format, stdout) if preset.usage is not None else None
    if structured is not None:
        stdout = structured
    lines = [ln.strip() for ln in stdout.splitlines()]
    if preset.message_after is not None:
        marker = re.compile(preset.message_after)
        hits = [i for i, ln in enumerate(lines) if marker.search(ln)]
        if hits:
            lines = lines[hits[-1] + 1 :]
    skip = re.compile(preset.message_skip) if preset.message_skip else None
    skipping = False
    for line in lines:
        if not line:
            skipping = False  # a skipped note ends with its paragraph (it may be wrapped)
        elif skip is not None and skip.search(line):
            skipping = True
        elif not skipping:
            return line
    return ""
