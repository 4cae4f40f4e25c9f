"""Tokens and cost per attempt from the real agent CLIs (issue 34), end to end.

Claude Code, Codex and Gemini CLI run batch tasks against the scripted model server
(``tests/helpers/model_stub.py``), which reports usage in each API's own fields (Anthropic's
``usage`` with cache creation and cache reads, the Responses API's ``input_tokens_details``,
Gemini's ``usageMetadata``); each CLI prints its own usage record (Claude Code's final JSON with
its ``total_cost_usd``, Codex's ``turn.completed`` events, Gemini CLI's ``stats``), and the run's
results.tsv, summary.json, ``status --json``, status and report.html show what each attempt
spent: the CLI's cost, the price table's (a ``pricing:`` of the config), or ``unknown``.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_clis import QUIET_ENV, require_cli
from cli_driver import CliResult
from model_stub import ANTHROPIC_USAGE, GEMINI_USAGE, RESPONSES_USAGE, EditRule, ModelStub

from gpuswarm.outputs.spend import money

pytestmark = pytest.mark.slow

PY = sys.executable
Cli = Callable[..., CliResult]
API_KEY = "sk-ant-stub-0123456789abcdef"
CODEX_KEY = "sk-codex-stub-0123456789"
RULE = EditRule(
    file="kernel.py",
    pattern=r"DEPTH = (\d+)",
    replace=lambda m: f"DEPTH = {int(m.group(1)) - 1}",
    description=lambda m: "lowered DEPTH",
)
EVALUATE = """\
import pathlib, re
depth = int(re.search(r"DEPTH = (\\d+)", pathlib.Path("kernel.py").read_text()).group(1))
pathlib.Path("task_result.yaml").write_text(f"pass_correctness: {str(depth == 7).lower()}\\n")
"""
CONFIG = """\
name: kernels
workspace: runs
{extra}
tasks:
  - glob: tasks/*/prompt.md
    agent:
      preset: {preset}
      prompt_file: "{{task_dir}}/prompt.md"
      copy_from: "{{task_dir}}"
      timeout: 90s
{agent_extra}
    command: {py} evaluate.py
    cwd: "{{workspace}}"
    done_when: task_result.yaml
"""
TASKS = ("gemm", "softmax")


def project(tmp_path: Path, preset: str, *, extra: str = "", agent_extra: str = "") -> Path:
    for name in TASKS:
        task = tmp_path / "tasks" / name
        task.mkdir(parents=True)
        (task / "kernel.py").write_text("BLOCK = 64\nDEPTH = 8\n")
        (task / "evaluate.py").write_text(EVALUATE)
        (task / "prompt.md").write_text(f"Make the {name} kernel in kernel.py faster.\n")
    cfg = tmp_path / "kernels.yaml"
    cfg.write_text(CONFIG.format(preset=preset, extra=extra, agent_extra=agent_extra, py=PY))
    return cfg


def the_run(tmp_path: Path) -> Path:
    (run,) = (tmp_path / "runs/kernels").glob("run_*")
    return run


def rows(run: Path) -> list[dict[str, str]]:
    with (run / "results.tsv").open() as f:
        return list(csv.DictReader(f, delimiter="\t"))


def requests_of(stub: ModelStub, path: str) -> int:
    return sum(1 for r in stub.requests if path in r["path"])


def check_everywhere(gpuswarm: Cli, run: Path, env: dict[str, str], cost_text: str) -> None:
    """status (text and --json) and report.html show what summary.json says was spent."""
    summary = json.loads((run / "summary.json").read_text())["cost"]
    res = gpuswarm("status", run, "--json", env=env)
    assert res.returncode == 0, res
    status = json.loads(res.stdout)["cost"]
    assert status["attempts"] == summary["attempts"] == 2
    assert status["tokens"] == summary["tokens_in"] + summary["tokens_out"]
    assert status["cost_unknown_attempts"] == summary["cost_unknown_attempts"]
    assert status["cost_usd"] == pytest.approx(summary["cost_usd"])
    text = gpuswarm("status", run, env=env)
    assert f"spent {cost_text}" in text.stdout, text.stdout
    report = (run / "report.html").read_text()
    assert "What the run cost" in report and "USD per successful task" in report
    assert cost_text in report


@pytest.mark.timeout(240)
def test_claude_code_reports_its_tokens_and_cost(gpuswarm: Cli, tmp_path: Path, home: Path) -> None:
    claude = require_cli("claude")
    cfg = project(tmp_path, "claude-code")
    with ModelStub(RULE) as stub:
        env = {"PATH": f"{claude.parent}:/usr/bin:/bin", "HOME": str(home), **QUIET_ENV,
               "ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_API_KEY": API_KEY}  # fmt: skip
        res = gpuswarm("run", cfg, "--gpus", "sim:1", env=env, timeout=200)
        assert res.returncode == 0, res
        calls = requests_of(stub, "/v1/messages")
    run = the_run(tmp_path)
    table = rows(run)
    assert [r["state"] for r in table] == ["done", "done"], table
    u = ANTHROPIC_USAGE
    per_call_in = (
        u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
    )
    assert sum(int(r["tokens_in"]) for r in table) == calls * per_call_in
    assert sum(int(r["tokens_cached"]) for r in table) == calls * u["cache_read_input_tokens"]
    assert sum(int(r["tokens_out"]) for r in table) == calls * u["output_tokens"]
    for r in table:  # Claude Code's own total_cost_usd, and the model it named
        assert float(r["cost_usd"]) > 0 and r["model"].startswith("claude-"), r
    summary = json.loads((run / "summary.json").read_text())["cost"]
    assert summary["cost_usd"] == pytest.approx(sum(float(r["cost_usd"]) for r in table))
    assert summary["usd_per_done_task"] == pytest.approx(summary["cost_usd"] / 2)
    assert summary["cost_unknown_attempts"] == 0 and summary["complete"]
    # every descriptor's attempt carries the five fields
    (done,) = {p.parent for p in run.glob(".parallel/done/*.json")}
    for path in done.iterdir():
        (attempt,) = json.loads(path.read_text())["attempts"]
        assert {"tokens_in", "tokens_cached", "tokens_out", "cost_usd", "model"} <= set(attempt)
    check_everywhere(gpuswarm, run, env, money(summary["cost_usd"]))


def codex_login(codex: Path, home: Path, stub: ModelStub) -> dict[str, str]:
    (home / ".codex").mkdir()
    (home / ".codex/config.toml").write_text(
        'model = "stub-codex"\nmodel_provider = "stub"\n[model_providers.stub]\n'
        f'name = "stub"\nbase_url = "{stub.url}/v1"\nwire_api = "responses"\n'
        "requires_openai_auth = true\n"
    )
    env = {"PATH": f"{codex.parent}:/usr/bin:/bin", "HOME": str(home), "NO_COLOR": "1"}
    login = subprocess.run(
        [str(codex), "login", "--with-api-key"], input=CODEX_KEY + "\n", env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert login.returncode == 0, login.stdout + login.stderr
    return env


@pytest.mark.timeout(240)
def test_codex_tokens_priced_by_the_config(gpuswarm: Cli, tmp_path: Path, home: Path) -> None:
    codex = require_cli("codex")
    prices = "pricing:\n  stub-codex: {input: 2.0, cached: 0.5, output: 8.0}"
    cfg = project(tmp_path, "codex", extra=prices, agent_extra="      model: stub-codex")
    with ModelStub(RULE) as stub:
        env = codex_login(codex, home, stub)
        res = gpuswarm("run", cfg, "--gpus", "sim:1", env=env, timeout=200)
        assert res.returncode == 0, res
        calls = requests_of(stub, "/v1/responses")
    run = the_run(tmp_path)
    table = rows(run)
    assert [r["state"] for r in table] == ["done", "done"], table
    u = RESPONSES_USAGE
    cached = u["input_tokens_details"]["cached_tokens"]
    assert sum(int(r["tokens_in"]) for r in table) == calls * u["input_tokens"]
    assert sum(int(r["tokens_cached"]) for r in table) == calls * cached
    assert sum(int(r["tokens_out"]) for r in table) == calls * u["output_tokens"]
    assert {r["model"] for r in table} == {"stub-codex"}
    per_call = ((u["input_tokens"] - cached) * 2.0 + cached * 0.5 + u["output_tokens"] * 8.0) / 1e6
    total = sum(float(r["cost_usd"]) for r in table)
    assert total == pytest.approx(calls * per_call, rel=1e-4)
    summary = json.loads((run / "summary.json").read_text())["cost"]
    assert summary["cost_usd"] == pytest.approx(total, rel=1e-4)
    check_everywhere(gpuswarm, run, env, money(summary["cost_usd"]))


@pytest.mark.timeout(240)
def test_gemini_unknown_model_costs_unknown(gpuswarm: Cli, tmp_path: Path, home: Path) -> None:
    gemini = require_cli("gemini")
    (home / ".gemini").mkdir()
    (home / ".gemini/settings.json").write_text(
        '{"security": {"auth": {"selectedType": "gemini-api-key"}}}\n'
    )
    cfg = project(tmp_path, "gemini")
    with ModelStub(RULE) as stub:
        env = {"PATH": f"{gemini.parent}:/usr/bin:/bin", "HOME": str(home),
               "GEMINI_API_KEY": "stub-gemini-key", "GOOGLE_GEMINI_BASE_URL": stub.url}  # fmt: skip
        res = gpuswarm("run", cfg, "--gpus", "sim:1", env=env, timeout=200)
        assert res.returncode == 0, res
        calls = requests_of(stub, "enerateContent")  # its router and main model
    run = the_run(tmp_path)
    table = rows(run)
    assert [r["state"] for r in table] == ["done", "done"], table
    g = GEMINI_USAGE
    assert sum(int(r["tokens_in"]) for r in table) == calls * g["promptTokenCount"]
    assert sum(int(r["tokens_out"]) for r in table) == calls * (
        g["candidatesTokenCount"] + g["thoughtsTokenCount"]
    )
    assert {r["cost_usd"] for r in table} == {"unknown"}  # its models have no price: never $0
    summary = json.loads((run / "summary.json").read_text())["cost"]
    assert summary["cost_unknown_attempts"] == 2 and not summary["complete"]
    assert any("no price for model gemini-" in p for p in summary["problems"]), summary
    check_everywhere(gpuswarm, run, env, "unknown")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


# -- research: the proposer's spend and --budget-usd -----------------------------------------
LOWER = EditRule(
    file="train.py",
    pattern=r"DEPTH = (\d+)",
    replace=lambda m: f"DEPTH = {int(m.group(1)) - 1}",
    description=lambda m: f"lower DEPTH to {int(m.group(1)) - 1}",
)


@pytest.mark.timeout(240)
def test_research_proposals_record_their_cost_and_the_budget_ends_the_loop(
    gpuswarm: Cli, research_repo: Path, home: Path
) -> None:
    claude = require_cli("claude")
    with ModelStub(LOWER) as stub:
        env = {"PATH": f"{claude.parent}:/usr/bin:/bin", "HOME": str(home), **QUIET_ENV,
               "ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_API_KEY": API_KEY}  # fmt: skip
        res = gpuswarm(
            "research", "init", "-C", research_repo, "--tag", "t", "--edit", "train.py",
            "--protect", "prepare.py", "--command", f"{PY} train.py", "--gpus", "sim:1",
            "--timeout", "20s", "--linger", "2s", "--policy", "greedy",
            "--baseline-repeats", "1", env=env,
        )  # fmt: skip
        assert res.returncode == 0, res
        try:
            res = gpuswarm(
                "research", "loop", "-C", research_repo, "--lookahead", "0",
                "--max-experiments", "3", "--plain", "--agent", "claude-code",
                "--budget-usd", "0.01", env=env, timeout=180,
            )  # fmt: skip
        finally:
            gpuswarm("research", "stop", "-C", research_repo, env=env)
    assert res.returncode == 1, res
    said = r"research budget spent: the proposer agent spent \$\d+\.\d\d of --budget-usd \$0\.01"
    assert re.search(said, res.output), res
    ledger = research_repo / ".gpuswarm/research/t/ledger.jsonl"
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    (made,) = [e for e in events if e.get("ev") == "proposal"]  # one, then the budget
    assert made["outcome"] == "made" and made["cost_usd"] > 0, made
    per_call = sum(
        ANTHROPIC_USAGE[k]
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    assert made["tokens_in"] % per_call == 0 and made["tokens_in"] > 0, made
    assert made["model"].startswith("claude-")


@pytest.mark.timeout(240)
def test_research_rows_carry_the_proposers_spend_and_budget_tokens_ends_the_loop(
    gpuswarm: Cli, research_repo: Path, home: Path
) -> None:
    claude = require_cli("claude")
    with ModelStub(LOWER) as stub:
        env = {"PATH": f"{claude.parent}:/usr/bin:/bin", "HOME": str(home), **QUIET_ENV,
               "ANTHROPIC_BASE_URL": stub.url, "ANTHROPIC_API_KEY": API_KEY}  # fmt: skip
        res = gpuswarm(
            "research", "init", "-C", research_repo, "--tag", "t", "--edit", "train.py",
            "--protect", "prepare.py", "--command", f"{PY} train.py", "--gpus", "sim:1",
            "--timeout", "20s", "--linger", "2s", "--policy", "greedy",
            "--baseline-repeats", "1", env=env,
        )  # fmt: skip
        assert res.returncode == 0, res
        loop = ("research", "loop", "-C", research_repo, "--lookahead", "0", "--plain",
                "--agent", "claude-code")  # fmt: skip
        try:
            res = gpuswarm(*loop, "--max-experiments", "1", env=env, timeout=180)
            assert res.returncode == 0, res
            bad = gpuswarm(*loop, "--budget-tokens", "lots", env=env)
            assert bad.returncode == 2 and "--budget-tokens" in bad.output, bad
            # the first loop's proposal counts: a second loop with a tiny budget stops at once
            spent = gpuswarm(*loop, "--max-experiments", "2", "--budget-tokens", "1", env=env)
        finally:
            gpuswarm("research", "stop", "-C", research_repo, env=env)
    said = r"the proposer agent used \d+ tokens of --budget-tokens 1; raise it: .*--budget-tokens"
    assert spent.returncode == 1 and re.search(said, spent.output), spent
    root = research_repo / ".gpuswarm/research/t"
    events = [json.loads(line) for line in (root / "ledger.jsonl").read_text().splitlines()]
    (made,) = [e for e in events if e.get("ev") == "proposal"]
    tokens = made["tokens_in"] + made["tokens_out"]
    with (root / "results.tsv").open() as f:
        table = list(csv.reader(f, delimiter="\t"))
    assert table[0][:5] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert table[0][5:] == ["proposer_tokens", "proposer_usd"], table[0]
    by_desc = {r[4]: r for r in table[1:]}
    base = next(r for d, r in by_desc.items() if "baseline" in d)
    (change,) = [r for d, r in by_desc.items() if "lower DEPTH" in d]
    assert base[5:] == ["", ""] and int(change[5]) == tokens, table
    assert float(change[6]) == pytest.approx(made["cost_usd"]) and made["cost_usd"] > 0
    log = json.loads(gpuswarm("research", "log", "-C", research_repo, "--json").stdout)
    (variant,) = [v for v in log["variants"] if v["proposer_tokens"] is not None]
    assert variant["proposer_tokens"] == tokens and variant["proposer_usd"] > 0, variant
    shown = gpuswarm("research", "log", "-C", research_repo, "--limit", "5").stdout
    assert shown.splitlines()[0].endswith("proposer_tokens\tproposer_usd"), shown
    report = gpuswarm("research", "report", "-C", research_repo)
    assert report.returncode == 0, report
    html = (root / "report.html").read_text()
    assert "<th>proposer_tokens</th>" in html and f"<td>{tokens}</td>" in html
