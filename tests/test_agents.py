"""Agent presets without the agent CLIs: every shipped preset's argument list, overrides and the
``custom`` form, the batch task script and the preflight check (run by /bin/sh against stand-in
programs that print what the real CLIs print), and what a config with ``agent:`` gives the run.

The real CLIs (Claude Code, aider) against a stub model server:
tests/integration/test_agents_real.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpuswarm.agents.command import (
    PROMPT_NAME,
    agent_argv,
    answer_line,
    find_program,
    invocation,
    preflight_script,
    provision_sources,
    task_script,
)
from gpuswarm.agents.preset import AgentUse, parse_seconds, preset_names, shipped_preset
from gpuswarm.config.load import load_config
from gpuswarm.core.errors import ConfigError, ResearchError
from gpuswarm.core.placeholders import render_shell
from gpuswarm.research.agent import check_agent, load_preset

PRESETS = ["aider", "claude-code", "codex", "cursor", "gemini", "opencode"]


def argv_of(name: str, **over: object) -> list[str]:
    preset = AgentUse.model_validate({"preset": name, **over}).resolved()
    return agent_argv(
        preset, preset.program, workdir="/w", prompt="PROMPT", prompt_file="/p.md", files=["k.py"]
    )


# -- presets as data -----------------------------------------------------------------------------
def test_every_agent_of_the_issue_is_shipped() -> None:
    assert preset_names() == [*PRESETS[:4], "custom", *PRESETS[4:]]
    for name in PRESETS:
        preset = shipped_preset(name)
        assert preset.preset == name
        assert preset.install, name
        assert preset.status.hint, name
        assert preset.provision, name  # the files of its login
        for item in preset.provision:
            assert item.src.startswith("~/") and not item.dest.startswith(("/", "~")), item


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "claude-code",
            ["claude", "-p", "--permission-mode", "bypassPermissions", "--output-format", "json",
             "--no-session-persistence", "--input-format", "text", "--model", "opus", "--effort",
             "high"],
        ),
        (
            "codex",
            ["codex", "exec", "--json", "--dangerously-bypass-approvals-and-sandbox",
             "--skip-git-repo-check", "--ephemeral", "-c", "features.memories=false", "--color",
             "never", "-C", "/w", "--model", "opus", "-c", "model_reasoning_effort=high", "--",
             "-"],
        ),
        (
            "opencode",
            ["opencode", "run", "--auto", "--dir", "/w", "--model", "opus", "--variant", "high",
             "PROMPT"],
        ),
        (
            "aider",
            ["aider", "--message-file", "/p.md", "--yes-always", "--no-git", "--no-auto-commits",
             "--no-check-update", "--no-show-release-notes", "--analytics-disable", "--no-pretty",
             "--no-fancy-input", "--no-detect-urls", "--no-suggest-shell-commands",
             "--no-restore-chat-history", "--no-show-model-warnings", "--edit-format", "diff",
             "--model", "opus", "--reasoning-effort", "high", "k.py"],
        ),
    ],
)  # fmt: skip
def test_argv_with_model_and_effort(name: str, expected: list[str]) -> None:
    assert argv_of(name, model="opus", effort="high") == expected


def test_argv_of_prompt_as_argument_presets() -> None:
    assert argv_of("cursor", model="gpt-5") == [
        "cursor-agent", "-p", "--force", "--trust", "--output-format", "text", "--workspace",
        "/w", "--model", "gpt-5", "--", "PROMPT",
    ]  # fmt: skip
    assert argv_of("gemini") == [
        "gemini", "--yolo", "--skip-trust", "--output-format", "json", "--prompt", "PROMPT",
    ]  # fmt: skip


def test_prompt_delivery_follows_the_placeholders() -> None:
    vias = {name: shipped_preset(name).prompt_via for name in PRESETS}
    assert vias == {
        "aider": "file",
        "claude-code": "stdin",
        "codex": "stdin",
        "cursor": "arg",
        "gemini": "arg",
        "opencode": "arg",
    }


def test_overrides_replace_add_and_merge() -> None:
    use = AgentUse.model_validate(
        {
            "preset": "claude-code",
            "program": "/opt/claude/bin/claude",
            "extra_args": ["--allowedTools", "Bash"],
            "env": {"DISABLE_TELEMETRY": "0", "MINE": "1"},
            "pass_env": ["MY_PROXY_TOKEN"],
            "provision": [{"src": "~/.claude/agents", "dest": ".claude/agents"}],
            "timeout": "5m",
        }
    )
    preset = use.resolved()
    assert preset.program == "/opt/claude/bin/claude"
    assert preset.options() == ["--allowedTools", "Bash"]
    assert preset.env["DISABLE_TELEMETRY"] == "0" and preset.env["MINE"] == "1"
    assert preset.env["DISABLE_AUTOUPDATER"] == "1"  # the preset's own stay
    assert preset.pass_env[0] == "ANTHROPIC_API_KEY" and preset.pass_env[-1] == "MY_PROXY_TOKEN"
    assert [p.dest for p in preset.provision][-1] == ".claude/agents"
    assert preset.timeout == 300.0


def test_custom_form() -> None:
    use = AgentUse.model_validate({"program": "myagent", "args": ["--task", "{prompt_file}"]})
    preset = use.resolved()
    assert preset.preset == "custom" and preset.prompt_via == "file"
    assert agent_argv(preset, "myagent", workdir="/w", prompt_file="/p") == [
        "myagent",
        "--task",
        "/p",
    ]
    with pytest.raises(ConfigError, match="custom needs program"):
        AgentUse.model_validate({"preset": "custom"}).resolved()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"preset": "claudecode"}, "not a preset; use one of aider, claude-code"),
        ({"preset": "gemini", "effort": "high"}, "gemini has no effort option"),
        ({"preset": "custom", "program": "x", "args": ["--p={prompt}"]}, "whole argument"),
        ({"preset": "codex", "timeout": "forever"}, "not a duration"),
        ({"preset": "codex", "pass_env": ["NOT-A-NAME"]}, "not an environment variable name"),
    ],
)
def test_bad_presets_are_refused(data: dict[str, object], message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        AgentUse.model_validate(data).resolved()


def test_parse_seconds() -> None:
    assert parse_seconds("1h30m") == 5400.0
    assert parse_seconds(90) == 90.0
    for bad in ("0", "8d", "1x", True):
        with pytest.raises(ValueError):
            parse_seconds(bad)


# -- finding the program -------------------------------------------------------------------------
def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def test_find_program_on_path_in_find_places_or_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    preset = shipped_preset("aider")
    assert find_program(preset) is None
    local = _exe(tmp_path / ".local/bin/aider", "#!/bin/sh\n")
    assert find_program(preset) == str(local)  # a find: place, absolute
    _exe(tmp_path / "bin/aider", "#!/bin/sh\n")
    assert find_program(preset) == "aider"  # on PATH: a name
    venv = _exe(tmp_path / "venv/bin/aider", "#!/bin/sh\n")
    configured = AgentUse(preset="aider", program=str(venv)).resolved()
    assert find_program(configured) == str(venv)


# -- provisioning --------------------------------------------------------------------------------
def test_provision_sources_only_the_files_that_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex/auth.json").write_text("{}")
    assert provision_sources(shipped_preset("codex")) == [
        (tmp_path / ".codex/auth.json", ".codex/auth.json")
    ]


# -- the preflight check, run by /bin/sh ---------------------------------------------------------
def run_sh(script: str, env: dict[str, str], cwd: Path | None = None) -> tuple[int, str]:
    proc = subprocess.run(
        ["/bin/sh", "-c", script],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def fake_cli(folder: Path, name: str, output: str, rc: int = 0) -> Path:
    body = f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\nexit {rc}\n"
    return _exe(folder / name, body)


def sh_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": str(home), **extra}


CLAUDE_OUT = {"loggedIn": True, "authMethod": "claude.ai", "apiProvider": "firstParty"}


@pytest.mark.parametrize(
    ("name", "output", "rc", "ok"),
    [
        ("claude", json.dumps(CLAUDE_OUT, indent=2), 0, True),
        ("claude", json.dumps({**CLAUDE_OUT, "loggedIn": False}, indent=2), 1, False),
        ("claude", json.dumps({**CLAUDE_OUT, "loggedIn": False}, indent=2), 0, False),
        ("codex", "Logged in using ChatGPT", 0, True),
        ("codex", "API key configured - sk-proj***abcd\nAuthentication is checked when", 0, True),
        ("codex", "Not logged in", 1, False),
        ("cursor-agent", "\u2713 Logged in as someone@example.com", 0, True),
        ("cursor-agent", "Not logged in", 0, False),
        ("opencode", "\u250c  Credentials\n\u2514  2 credentials", 0, True),
        ("opencode", "\u2514  0 credentials", 0, False),
    ],
)  # fmt: skip
def test_preflight_parses_the_status_output(
    tmp_path: Path, name: str, output: str, rc: int, ok: bool
) -> None:
    preset = {"claude": "claude-code", "cursor-agent": "cursor"}.get(name, name)
    fake_cli(tmp_path / "bin", name, output, rc)
    code, out = run_sh(preflight_script(shipped_preset(preset)), sh_env(tmp_path))
    assert (code == 0) == ok, out
    if ok:
        assert f"agent {preset}: logged in" in out
    else:
        assert code == 1 and shipped_preset(preset).status.hint in out, out


def test_preflight_not_installed_names_the_install(tmp_path: Path) -> None:
    code, out = run_sh(preflight_script(shipped_preset("claude-code")), sh_env(tmp_path))
    assert code == 127
    assert "claude is not installed" in out and "npm install -g @anthropic-ai/claude-code" in out


def test_preflight_variables_and_files_count_as_login(tmp_path: Path) -> None:
    fake_cli(tmp_path / "bin", "codex", "Not logged in", 1)
    codex = preflight_script(shipped_preset("codex"))
    assert run_sh(codex, sh_env(tmp_path))[0] == 1
    code, out = run_sh(codex, sh_env(tmp_path, CODEX_API_KEY="sk-x"))
    assert code == 0 and "CODEX_API_KEY is set" in out and "sk-x" not in out
    fake_cli(tmp_path / "bin", "gemini", "", 0)
    gemini = preflight_script(shipped_preset("gemini"))
    code, out = run_sh(gemini, sh_env(tmp_path))
    assert code == 1 and "no login found (none of GEMINI_API_KEY" in out
    creds = tmp_path / "home/.gemini/oauth_creds.json"
    creds.parent.mkdir(parents=True)
    creds.write_text("{}")
    assert run_sh(gemini, sh_env(tmp_path))[0] == 0


# -- a batch task's script, run by /bin/sh -------------------------------------------------------
FAKE_AGENT = r"""#!/bin/sh
# a stand-in agent: records its argv, cwd and stdin, and appends a line to kernel.py
printf '%s\n' "$@" > "$GS_TEST_OUT/argv"
pwd > "$GS_TEST_OUT/cwd"
cat > "$GS_TEST_OUT/stdin"
echo "# tuned" >> kernel.py
exit "${GS_TEST_RC:-0}"
"""


def run_task_script(
    tmp_path: Path, use: AgentUse, evaluate: list[str] | str, *, shell: bool = False, **env: str
) -> tuple[int, str, Path]:
    ws = tmp_path / "ws"
    task = tmp_path / "task folder"
    ws.mkdir(exist_ok=True)
    task.mkdir(exist_ok=True)
    (task / "kernel.py").write_text("x = 1\n")
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    script = task_script(use, use.resolved(), evaluate, evaluate_shell=shell)
    text = render_shell(script, {"workspace": str(ws), "task_dir": str(task), "name": "k1"})
    code, output = run_sh(text, sh_env(tmp_path, GS_TEST_OUT=str(out), **env), cwd=ws)
    return code, output, out


def test_task_script_runs_the_agent_then_the_evaluation(tmp_path: Path) -> None:
    _exe(tmp_path / "bin/claude", FAKE_AGENT)
    use = AgentUse(preset="claude-code", prompt="optimise {name}", copy_from="{task_dir}")
    evaluate = ["/bin/sh", "-c", "cat kernel.py > result.txt"]
    code, output, out = run_task_script(tmp_path, use, evaluate)
    ws = tmp_path / "ws"
    assert code == 0, output
    assert (out / "stdin").read_text() == "optimise k1\n"  # the prompt on stdin, rendered
    assert (ws / PROMPT_NAME).read_text() == "optimise k1\n"
    assert Path((out / "cwd").read_text().strip()) == ws
    assert (ws / "result.txt").read_text() == "x = 1\n# tuned\n"  # copied, edited, evaluated
    assert (tmp_path / "task folder/kernel.py").read_text() == "x = 1\n"  # source untouched
    assert (out / "argv").read_text().split("\n")[:2] == ["-p", "--permission-mode"]


def test_task_script_prompt_file_as_argument_and_workdir(tmp_path: Path) -> None:
    _exe(tmp_path / "bin/cursor-agent", FAKE_AGENT)
    prompt = tmp_path / "prompt's.md"
    prompt.write_text("line 1\n$(touch pwned) `x`\n")
    use = AgentUse(preset="cursor", prompt_file=str(prompt), workdir="{workspace}/sub dir")
    (tmp_path / "ws/sub dir").mkdir(parents=True)
    code, output, out = run_task_script(tmp_path, use, "true")
    assert code == 0, output
    argv = (out / "argv").read_text()
    assert argv.endswith("line 1\n$(touch pwned) `x`\n")  # one argument, never run
    assert f"--workspace\n{tmp_path / 'ws/sub dir'}\n" in argv
    assert not list(tmp_path.rglob("pwned"))


def test_task_script_failed_agent_stops_or_evaluates(tmp_path: Path) -> None:
    _exe(tmp_path / "bin/claude", FAKE_AGENT)
    use = AgentUse(preset="claude-code", prompt="p")
    code, output, _ = run_task_script(tmp_path, use, ["touch", "evaluated"], GS_TEST_RC="3")
    assert code == 3 and "gpuswarm agent: claude-code exited 3" in output
    assert not (tmp_path / "ws/evaluated").exists()
    use = AgentUse(preset="claude-code", prompt="p", on_failure="evaluate")
    code, output, _ = run_task_script(tmp_path, use, ["touch", "evaluated"], GS_TEST_RC="3")
    assert code == 0 and (tmp_path / "ws/evaluated").exists()


def test_task_script_bounds_the_agent_by_its_timeout(tmp_path: Path) -> None:
    _exe(tmp_path / "bin/claude", "#!/bin/sh\nexec sleep 30\n")
    use = AgentUse(preset="claude-code", prompt="p", timeout=1)
    code, output, _ = run_task_script(tmp_path, use, "true")
    assert code == 124 and "claude-code ran past 1s" in output


# -- research: how the proposer runs it ----------------------------------------------------------
def test_invocation_of_each_prompt_delivery(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.md"
    prompt.write_text("the prompt")
    claude = invocation(shipped_preset("claude-code"), workdir=tmp_path, prompt_file=prompt)
    assert claude.stdin == prompt and claude.env["DISABLE_AUTOUPDATER"] == "1"
    cursor = invocation(shipped_preset("cursor"), workdir=tmp_path, prompt_file=prompt)
    assert cursor.stdin is None and cursor.argv[-1] == "the prompt"
    aider = invocation(
        shipped_preset("aider"), workdir=tmp_path, prompt_file=prompt, files=["t.py"]
    )
    assert aider.argv[1:3] == ["--message-file", str(prompt)] and aider.argv[-1] == "t.py"


# -- a config with agent: ------------------------------------------------------------------------
CONFIG = """
backend: {backend}
{docker}
tasks:
  - glob: tasks/*
    agent:
      preset: claude-code
      prompt_file: "{{task_dir}}/prompt.md"
      copy_from: "{{task_dir}}"
      model: sonnet
    command: python eval.py --out task_result.yaml
    cwd: "{{workspace}}"
    done_when: task_result.yaml
"""


def write_config(tmp_path: Path, docker: bool = False) -> Path:
    (tmp_path / "tasks/k1").mkdir(parents=True)
    (tmp_path / "tasks/k1/prompt.md").write_text("make it fast")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        CONFIG.format(
            backend="docker" if docker else "local",
            docker="docker: {image: img, pass_env: [HF_TOKEN]}" if docker else "",
        )
    )
    return cfg


def test_config_agent_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude/.credentials.json").write_text("{}")
    (home / ".claude.json").write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    loaded = load_config(write_config(tmp_path))
    (task,) = loaded.tasks
    assert task.shell and isinstance(task.command, str)
    assert "claude -p" in task.command and "--model sonnet" in task.command
    assert task.command.rstrip().endswith("exec python eval.py --out task_result.yaml")
    assert task.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    home_cfg = loaded.config.home
    assert home_cfg.isolate  # a private HOME per slot, as agents need
    assert [(p.src, p.dest) for p in home_cfg.provision] == [
        (str(home / ".claude/.credentials.json"), ".claude/.credentials.json"),
        (str(home / ".claude.json"), ".claude.json"),
    ]
    (check,) = loaded.config.preflight
    assert check.startswith("# agent claude-code: is it installed and logged in?")


def test_config_agent_docker_passes_the_keys_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret-value")
    loaded = load_config(write_config(tmp_path, docker=True))
    assert loaded.config.docker is not None
    names = loaded.config.docker.pass_env
    assert names[0] == "HF_TOKEN" and "ANTHROPIC_API_KEY" in names
    assert "sk-ant-secret-value" not in json.dumps(loaded.config.model_dump(mode="json"))
    assert loaded.config.home.provision == []  # none of the login files exist here


def test_config_isolate_false_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text() + "home: {isolate: false}\n")
    assert not load_config(cfg).config.home.isolate


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ("{preset: aider, prompt: x}", "list them in agent.files"),
        ("codexx", "'codexx' is not a preset"),
        ("{preset: codex}", r"add prompt: \(the text\), prompt: {template: FILE} or prompt_file:"),
        ("{preset: codex, prompt: 'fix {nope}'}", "unknown placeholder {nope}"),
    ],
)
def test_config_agent_errors_are_located(tmp_path: Path, agent: str, message: str) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"tasks:\n  - name: t\n    command: 'true'\n    agent: {agent}\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_config(cfg)
    assert "run.yaml:2" in str(info.value) or "run.yaml:4" in str(info.value), info.value


def test_no_agent_leaves_the_config_alone(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("tasks:\n  - command: python x.py\n")
    loaded = load_config(cfg)
    assert not loaded.config.home.isolate and loaded.config.preflight == []
    assert os.fspath(loaded.tasks[0].command[0]) == "python"


# -- the answer line (a research variant's description) ------------------------------------------
AIDER_OUT = """\
Aider v0.86.2
Model: openai/stub with diff edit format
Git repo: none
Added train.py to the chat.
Note: in-chat filenames are always relative to the git working dir, not the current working dir.
Cur working dir: /x/work

lower DEPTH to 7

train.py
Tokens: 1.9k sent, 32 received.
Applied edit to train.py
"""


def test_answer_line() -> None:
    assert answer_line(shipped_preset("aider"), AIDER_OUT) == "lower DEPTH to 7"
    wrapped = AIDER_OUT.replace("not the current", "not the\ncurrent")  # an 80-column note
    assert answer_line(shipped_preset("aider"), wrapped) == "lower DEPTH to 7"
    claude = shipped_preset("claude-code")
    assert (
        answer_line(claude, "\n  Lowered DEPTH to 7.\n\nIt should help.\n") == "Lowered DEPTH to 7."
    )
    assert answer_line(claude, "") == ""


# -- --agent of research loop --------------------------------------------------------------------
def test_load_preset_by_name_or_file(tmp_path: Path) -> None:
    preset = load_preset("codex", model="gpt-5-codex", effort="high")
    assert preset.options() == ["--model", "gpt-5-codex", "-c", "model_reasoning_effort=high"]
    path = tmp_path / "mine.yaml"
    path.write_text(
        "preset: aider\nprogram: /opt/aider/bin/aider\nextra_args: [--map-tokens, '0']\n"
    )
    preset = load_preset(str(path), model="openai/x")
    assert preset.program == "/opt/aider/bin/aider"
    assert preset.options() == ["--model", "openai/x", "--map-tokens", "0"]
    path.write_text("preset: aider\nprompt: batch only\n")
    with pytest.raises(ResearchError, match="prompt is for batch tasks"):
        load_preset(str(path))
    with pytest.raises(ResearchError, match="'nope' is not a preset"):
        load_preset("nope")
    with pytest.raises(ResearchError, match="gemini has no effort option"):
        load_preset("gemini", effort="max")


def test_check_agent_reports_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"  # what the check uses, and no codex
    tools.mkdir()
    for tool in ("cat", "grep", "timeout"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{tools}")
    with pytest.raises(ResearchError, match=r"agent codex is not ready:\n.*codex is not installed"):
        check_agent(shipped_preset("codex"))
    fake_cli(tmp_path / "bin", "codex", "Logged in using ChatGPT")
    assert check_agent(shipped_preset("codex")).endswith("agent codex: logged in")


def test_defaults_agent_merges_with_the_task_agent(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "defaults:\n  agent: {preset: codex, model: gpt-5-codex, env: {A: '1'}}\n"
        "tasks:\n"
        "  - {name: a, command: 'true', agent: {prompt: one, env: {B: '2'}}}\n"
        "  - {name: b, command: 'true', agent: {prompt: two, model: o3}}\n"
    )
    a, b = load_config(cfg).tasks
    assert isinstance(a.command, str) and isinstance(b.command, str)
    assert "codex exec" in a.command and "--model gpt-5-codex" in a.command
    assert a.env["A"] == "1" and a.env["B"] == "2"
    assert "codex exec" in b.command and "--model o3" in b.command


def test_docker_agent_program_is_never_a_host_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    _exe(home / ".local/bin/cursor-agent", "#!/bin/sh\n")  # found here, in a find: place
    cfg = tmp_path / "run.yaml"
    body = "tasks:\n  - {name: a, command: 'true', agent: {preset: cursor, prompt: p}}\n"
    cfg.write_text(body)
    local = load_config(cfg)
    assert str(home / ".local/bin/cursor-agent") in str(local.tasks[0].command)
    cfg.write_text("backend: docker\ndocker: {image: img}\n" + body)
    docker = load_config(cfg)
    assert str(home) not in str(docker.tasks[0].command)
    assert " cursor-agent -p " in str(docker.tasks[0].command)
    assert "gs_prog=cursor-agent\n" in docker.config.preflight[0]
