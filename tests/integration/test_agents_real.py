"""Real agent CLIs, end to end, against a scripted model server on 127.0.0.1 (no network).

Claude Code, Codex and Gemini CLI (npm) and aider (PyPI, in its own virtualenv) are the real
programs; only the model is a stub (``tests/helpers/model_stub.py``): it answers Claude Code with
its own ``Read`` and ``Edit`` tool calls, Codex with its shell tool (``cat``, then
``apply_patch``), Gemini CLI with its ``read_file`` and ``replace`` tools and aider with a
search/replace block, so each CLI edits the file through its own edit mechanism.
The CLIs are found by ``tests/helpers/agent_clis.py`` (installed by ``.ci/run``); without one a
test skips here and fails under CI.

- research: ``research loop --agent claude-code`` / ``codex`` / ``gemini`` / ``--agent <aider
  preset file>``: the CLI's edit is the variant gpuswarm runs and records (a results.tsv row,
  the answer as description);
  an agent that edits nothing is counted and capped; a CLI without a login stops the loop
  before anything starts;
- batch: a task with ``agent:`` runs Claude Code (or Codex) over a copy of the task folder (its
  login files provisioned into the slot's private HOME: Codex finds its API-key login and its
  model provider only there), then the task's evaluation writes its result file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_clis import QUIET_ENV, require_cli
from cli_driver import CliResult
from integration_support import git, research_ledger, research_results
from model_stub import EditRule, ModelStub, request_text

pytestmark = pytest.mark.slow

PY = sys.executable
Cli = Callable[..., CliResult]
TAG = "t"
API_KEY = "sk-ant-stub-0123456789abcdef"

LOWER_DEPTH = EditRule(
    file="train.py",
    pattern=r"DEPTH = (\d+)",
    replace=lambda m: f"DEPTH = {int(m.group(1)) - 1}",
    description=lambda m: f"lower DEPTH to {int(m.group(1)) - 1}",
)
KERNEL_RULE = EditRule(
    file="kernel.py",
    pattern=r"DEPTH = (\d+)",
    replace=lambda m: f"DEPTH = {int(m.group(1)) - 1}",
    description=lambda m: "lowered DEPTH",
)
NO_MATCH = EditRule("train.py", r"NO_SUCH_SETTING = (\d+)", lambda m: "", lambda m: "")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """The user's HOME for the CLIs (never the real one)."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def claude_stub() -> Iterator[ModelStub]:
    with ModelStub(LOWER_DEPTH) as stub:
        yield stub


def claude_env(claude: Path, home: Path, stub: ModelStub | None) -> dict[str, str]:
    env = {
        "PATH": f"{claude.parent}:/usr/bin:/bin",
        "HOME": str(home),
        **QUIET_ENV,
    }
    if stub is not None:
        env |= {"ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_API_KEY": API_KEY}
    return env


CODEX_KEY = "sk-codex-stub-0123456789"


def codex_login(codex: Path, home: Path, stub: ModelStub) -> dict[str, str]:
    """A user of Codex: a model provider in ~/.codex/config.toml (the stub) and an API-key login
    made by the real ``codex login --with-api-key`` (~/.codex/auth.json)."""
    (home / ".codex").mkdir()
    (home / ".codex/config.toml").write_text(
        'model = "stub-codex"\nmodel_provider = "stub"\n[model_providers.stub]\n'
        f'name = "stub"\nbase_url = "{stub.url}/v1"\nwire_api = "responses"\n'
        "requires_openai_auth = true\n"
    )
    env = {"PATH": f"{codex.parent}:/usr/bin:/bin", "HOME": str(home), "NO_COLOR": "1"}
    login = subprocess.run(
        [str(codex), "login", "--with-api-key"],
        input=CODEX_KEY + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert login.returncode == 0, login.stdout + login.stderr
    assert (home / ".codex/auth.json").is_file()
    return env


def init(gpuswarm: Cli, repo: Path, env: dict[str, str]) -> None:
    res = gpuswarm(
        "research", "init", "-C", repo, "--tag", TAG, "--edit", "train.py",
        "--protect", "prepare.py", "--command", f"{PY} train.py", "--gpus", "sim:1",
        "--timeout", "20s", "--linger", "2s", "--policy", "greedy", "--baseline-repeats", "1",
        env=env,
    )  # fmt: skip
    assert res.returncode == 0, res


def stop(gpuswarm: Cli, repo: Path, env: dict[str, str]) -> None:
    res = gpuswarm("research", "stop", "-C", repo, env=env)
    assert res.returncode == 0, res


def loop(gpuswarm: Cli, repo: Path, env: dict[str, str], *args: str) -> CliResult:
    return gpuswarm(
        "research", "loop", "-C", repo, "--lookahead", "0", "--max-experiments", "1",
        "--plain", *args, env=env, timeout=150,
    )  # fmt: skip


def agent_rows(repo: Path) -> list[list[str]]:
    table = research_results(repo, TAG)
    # the seed's five columns first and unchanged, then the proposer's spend (issue 34): every
    # real CLI here reports its usage, so the columns are there
    assert table[0] == [
        "commit", "val_bpb", "memory_gb", "status", "description", "proposer_tokens", "proposer_usd"
    ]  # fmt: skip
    return table[1:]


def program_md(tmp_path: Path) -> Path:
    path = tmp_path / "program.md"
    path.write_text("# program\nPROGRAM-MARKER: lower val_bpb. Edit train.py only.\n")
    return path


def assert_agent_variant(repo: Path, description: str) -> None:
    """The baseline's row(s) and one row of the agent's variant, kept (DEPTH 7 beats 8), with the
    agent's answer as its description and its edit in the variant's commit."""
    rows = agent_rows(repo)
    baselines = [r for r in rows if "baseline" in r[4]]
    assert baselines and all(r[3] == "keep" for r in baselines), rows
    # the loop's BASE control runs (paired decisions, issue 29) are rows of their own
    (mine,) = [r for r in rows if r not in baselines and "control: BASE" not in r[4]]
    assert mine[3] == "keep" and mine[4].endswith(f"] {description}"), rows  # [gpu0] ...
    assert float(mine[1]) < float(baselines[0][1]), rows
    (variant,) = [
        e
        for e in research_ledger(repo, TAG)
        if e.get("ev") == "variant" and e.get("source") == "agent"
    ]
    assert "\nDEPTH = 7\n" in git(repo, "show", f"{variant['commit']}:train.py")
    assert git(repo, "rev-parse", f"autoresearch/{TAG}") == variant["commit"]  # BASE advanced


# -- research ------------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_research_round_with_claude_code(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path, home: Path, claude_stub: ModelStub
) -> None:
    claude = require_cli("claude")
    env = claude_env(claude, home, claude_stub)
    init(gpuswarm, research_repo, env)
    try:
        res = loop(gpuswarm, research_repo, env, "--agent", "claude-code", "--program",
                   str(program_md(tmp_path)))  # fmt: skip
        assert res.returncode == 0, res
        assert_agent_variant(research_repo, "lower DEPTH to 7")
    finally:
        stop(gpuswarm, research_repo, env)
    (first, *_) = claude_stub.main_requests()
    prompt = request_text(first)
    assert "PROGRAM-MARKER" in prompt and "## Recent results" in prompt, prompt[-2000:]
    keys = {h.get("x-api-key") for h in claude_stub.headers}
    assert keys == {API_KEY}, keys
    assert API_KEY not in (research_repo / ".gpuswarm/research" / TAG / "ledger.jsonl").read_text()


@pytest.mark.timeout(180)
def test_research_round_with_codex(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path, home: Path
) -> None:
    codex = require_cli("codex")
    with ModelStub(LOWER_DEPTH) as stub:
        env = codex_login(codex, home, stub) | {"CODEX_HOME": str(home / ".codex")}
        init(gpuswarm, research_repo, env)
        try:
            res = loop(gpuswarm, research_repo, env, "--agent", "codex", "--agent-effort", "low",
                       "--program", str(program_md(tmp_path)))  # fmt: skip
            assert res.returncode == 0, res
            assert_agent_variant(research_repo, "lower DEPTH to 7")
        finally:
            stop(gpuswarm, research_repo, env)
        first, *_ = stub.main_requests()
        assert "PROGRAM-MARKER" in request_text(first)
        assert first["reasoning"]["effort"] == "low"  # --agent-effort reached the model call
        assert {h.get("authorization") for h in stub.headers} == {f"Bearer {CODEX_KEY}"}


@pytest.mark.timeout(180)
def test_research_round_with_gemini(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path, home: Path
) -> None:
    gemini = require_cli("gemini")
    (home / ".gemini").mkdir()  # the user's settings: an API key (a gateway: the stub's URL)
    (home / ".gemini/settings.json").write_text(
        '{"security": {"auth": {"selectedType": "gemini-api-key"}}}\n'
    )
    with ModelStub(LOWER_DEPTH) as stub:
        env = {
            "PATH": f"{gemini.parent}:/usr/bin:/bin",
            "HOME": str(home),
            "GEMINI_API_KEY": "stub-gemini-key",
            "GOOGLE_GEMINI_BASE_URL": stub.url,
        }
        init(gpuswarm, research_repo, env)
        try:
            res = loop(gpuswarm, research_repo, env, "--agent", "gemini", "--program",
                       str(program_md(tmp_path)))  # fmt: skip
            assert res.returncode == 0, res
            assert_agent_variant(research_repo, "lower DEPTH to 7")
        finally:
            stop(gpuswarm, research_repo, env)
        assert any("PROGRAM-MARKER" in request_text(b) for b in stub.main_requests())
        assert {h.get("x-goog-api-key") for h in stub.headers} == {"stub-gemini-key"}


@pytest.mark.timeout(180)
def test_research_round_with_aider(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path, home: Path
) -> None:
    aider = require_cli("aider")
    preset = tmp_path / "aider.yaml"  # the preset with a configured program and model
    preset.write_text(f"preset: aider\nprogram: {aider}\nmodel: openai/stub-coder\n")
    with ModelStub(LOWER_DEPTH) as stub:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "OPENAI_API_BASE": stub.url + "/v1",
            "OPENAI_API_KEY": "sk-stub-openai",
            **QUIET_ENV,
        }
        init(gpuswarm, research_repo, env)
        try:
            res = loop(gpuswarm, research_repo, env, "--agent", str(preset), "--program",
                       str(program_md(tmp_path)))  # fmt: skip
            assert res.returncode == 0, res
            assert_agent_variant(research_repo, "lower DEPTH to 7")
        finally:
            stop(gpuswarm, research_repo, env)
        (request,) = stub.main_requests()
        assert request["model"] == "stub-coder"
        assert "PROGRAM-MARKER" in request_text(request)


@pytest.mark.timeout(120)
def test_research_agent_that_edits_nothing_is_capped(
    gpuswarm: Cli, research_repo: Path, home: Path
) -> None:
    claude = require_cli("claude")
    with ModelStub(NO_MATCH) as stub:
        env = claude_env(claude, home, stub)
        init(gpuswarm, research_repo, env)
        try:
            res = loop(gpuswarm, research_repo, env, "--agent", "claude-code",
                       "--agent-max-failures", "2")  # fmt: skip
            assert res.returncode == 2, res
            assert "agent failed 2 times" in res.stderr and "changed none of train.py" in res.stderr
        finally:
            stop(gpuswarm, research_repo, env)
        assert len(stub.main_requests()) >= 4  # two real conversations: read, then nothing
    proposals = [e for e in research_ledger(research_repo, TAG) if e.get("ev") == "proposal"]
    assert [p["outcome"] for p in proposals] == ["failed", "failed"], proposals
    assert not [e for e in research_ledger(research_repo, TAG) if e.get("ev") == "variant"]


@pytest.mark.timeout(60)
def test_research_agent_without_login_stops_before_anything(
    gpuswarm: Cli, research_repo: Path, home: Path
) -> None:
    claude = require_cli("claude")
    env = claude_env(claude, home, None)  # no API key, no login files
    init(gpuswarm, research_repo, env)
    try:
        res = loop(gpuswarm, research_repo, env, "--agent", "claude-code")
        assert res.returncode == 2, res
        assert "agent claude-code is not ready" in res.stderr, res
        assert '"loggedIn": false' in res.stderr and "claude auth login" in res.stderr, res
    finally:
        stop(gpuswarm, research_repo, env)
    assert not (research_repo / ".gpuswarm/research" / TAG / "prompts").exists()


# -- batch ---------------------------------------------------------------------------------------
KERNEL = "BLOCK = 64\nDEPTH = 8\n"
EVALUATE = """\
import pathlib, re
text = pathlib.Path("kernel.py").read_text()
depth = int(re.search(r"DEPTH = (\\d+)", text).group(1))
pathlib.Path("task_result.yaml").write_text(
    f"pass_correctness: true\\ndepth: {depth}\\nspeedup: {8 / depth:.3f}\\n"
)
print(f"speedup={8 / depth:.3f}")
"""
BATCH = """\
name: kernels
workspace: runs
tasks:
  - glob: tasks/*/prompt.md
    agent:
      preset: claude-code
      prompt_file: "{{task_dir}}/prompt.md"
      copy_from: "{{task_dir}}"
      timeout: 90s
    command: {py} evaluate.py
    cwd: "{{workspace}}"
    done_when: task_result.yaml
    metrics: {{speedup: 'speedup=([0-9.]+)'}}
"""


def batch_project(tmp_path: Path) -> Path:
    for name in ("softmax", "gemm"):
        task = tmp_path / "tasks" / name
        task.mkdir(parents=True)
        (task / "kernel.py").write_text(KERNEL)
        (task / "evaluate.py").write_text(EVALUATE)
        (task / "prompt.md").write_text(f"Make the {name} kernel in kernel.py faster.\n")
    cfg = tmp_path / "kernels.yaml"
    cfg.write_text(BATCH.format(py=PY))
    return cfg


@pytest.fixture
def kernel_stub() -> Iterator[ModelStub]:
    with ModelStub(KERNEL_RULE) as stub:
        yield stub


@pytest.mark.timeout(180)
def test_batch_task_with_claude_code(
    gpuswarm: Cli, tmp_path: Path, home: Path, kernel_stub: ModelStub
) -> None:
    claude_stub = kernel_stub
    claude = require_cli("claude")
    settings = home / ".claude/settings.json"  # the user's settings: copied, never written
    settings.parent.mkdir()
    settings.write_text('{"theme": "dark"}\n')
    cfg = batch_project(tmp_path)
    res = gpuswarm("run", cfg, "--gpus", "sim:2", env=claude_env(claude, home, claude_stub),
                   timeout=150)  # fmt: skip
    assert res.returncode == 0, res
    (run,) = (tmp_path / "runs/kernels").glob("run_*")
    for name in ("softmax", "gemm"):
        ws = run / "tasks" / f"tasks-{name}-prompt.md"
        if not ws.exists():  # the id of a glob task is its folder's path
            (ws,) = [p for p in (run / "tasks").iterdir() if name in p.name]
        assert (ws / "kernel.py").read_text() == "BLOCK = 64\nDEPTH = 7\n"  # Claude's Edit
        result = (ws / "task_result.yaml").read_text()
        assert "pass_correctness: true" in result and "depth: 7" in result, result
        assert (tmp_path / "tasks" / name / "kernel.py").read_text() == KERNEL  # source kept
    summary = json.loads((run / "summary.json").read_text())
    assert summary["counts"]["done"] == 2, summary
    # each slot's private HOME got a private, writable copy of the user's settings
    for slot_home in (run / "homes").iterdir():
        copy = slot_home / ".claude/settings.json"
        assert copy.read_text() == settings.read_text()
        assert copy.stat().st_mode & 0o777 == 0o600
    assert settings.stat().st_mode & 0o777 == 0o644
    # the preflight ran the real `claude auth status` in every slot
    logs = "".join(p.read_text() for p in (run / "preflight").glob("*.log"))
    assert len(re.findall(r"(?m)^agent claude-code: logged in$", logs)) == 2, logs
    assert '"apiKeySource": "ANTHROPIC_API_KEY"' in logs
    # the key reached the CLI, and nothing the run wrote
    assert {h.get("x-api-key") for h in claude_stub.headers} == {API_KEY}
    for path in run.rglob("*"):
        if path.is_file() and ".parallel" not in path.parts:
            assert API_KEY not in path.read_text(errors="replace"), path
    prompts = [request_text(b) for b in claude_stub.main_requests()]
    assert any(re.search(r"Make the softmax kernel", p) for p in prompts)


@pytest.mark.timeout(180)
def test_batch_task_with_codex(gpuswarm: Cli, tmp_path: Path, home: Path) -> None:
    codex = require_cli("codex")
    cfg = batch_project(tmp_path)
    cfg.write_text(cfg.read_text().replace("preset: claude-code", "preset: codex"))
    with ModelStub(KERNEL_RULE) as stub:
        env = codex_login(codex, home, stub)  # no key variable: the login file is the login
        auth = (home / ".codex/auth.json").read_bytes()
        res = gpuswarm("run", cfg, "--gpus", "sim:1", env=env, timeout=150)
        assert res.returncode == 0, res
        assert {h.get("authorization") for h in stub.headers} == {f"Bearer {CODEX_KEY}"}
    (run,) = (tmp_path / "runs/kernels").glob("run_*")
    for name in ("softmax", "gemm"):
        (ws,) = [p for p in (run / "tasks").iterdir() if name in p.name]
        assert (ws / "kernel.py").read_text() == "BLOCK = 64\nDEPTH = 7\n"  # its apply_patch
        assert "depth: 7" in (ws / "task_result.yaml").read_text()
    (slot_home,) = (run / "homes").iterdir()
    for rel in (".codex/auth.json", ".codex/config.toml"):  # its CODEX_HOME, provisioned
        copy = slot_home / rel
        assert copy.stat().st_mode & 0o777 == 0o600, rel  # private, writable by the agent
    config = ".codex/config.toml"
    assert (slot_home / config).read_bytes() == (home / config).read_bytes()
    assert (home / ".codex/auth.json").read_bytes() == auth  # the user's login, untouched
    logs = "".join(p.read_text() for p in (run / "preflight").glob("*.log"))
    assert "API key configured" in logs and CODEX_KEY not in logs, logs  # `codex login status`
    assert re.search(r"(?m)^agent codex: logged in$", logs), logs
