"""Issue 38 end to end, through the real CLI on simulated GPUs: a loop without pruning, its
replay with ``--prune median`` (what it would have stopped), a loop with ``--prune median`` that
stops a clear loser (row ``pruned``, counted apart from crashes, GPU time saved), and
``research try --rerun`` running the pruned variant in full.

The toy prints twenty progress lines over 3 s; each run's values differ from the others' by a
small deterministic jitter (the noise), and ``LR`` far from 0.04 makes every point worse.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, wait_for
from dashkit import browser_context, browser_missing, require_browser, start_dashboard
from integration_support import make_research_repo, research_ledger, research_results

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]
PY = sys.executable
TAG = "prune"

TRAIN_PY = """\
import fcntl
import time

LR = 0.04
with open({counter!r}, "a+") as fh:  # which run this is: its jitter
    fcntl.flock(fh, fcntl.LOCK_EX)
    fh.seek(0)
    k = len(fh.read())
    fh.write("x")
jitter = ((k * 37) % 5 - 2) * 0.004
for i in range(1, 21):  # long enough for the cancel to land before it ends
    time.sleep(0.15)
    val = 2.0 - 0.025 * i + jitter + abs(LR - 0.04) * 2
    print(f"progress: elapsed={{i * 0.15:.2f}} val_bpb={{val:.6f}}", flush=True)
print(f"val_bpb: {{val:.6f}}")
"""

AGENT_PY = """\
import os, pathlib, sys, time
edits = {edits!r}
count = pathlib.Path({count!r})
n = len(count.read_text()) if count.exists() else 0
if n >= len(edits):
    time.sleep(6)  # the loop watches its variants meanwhile (and prunes)
    sys.exit(3)  # nothing more to propose: the loop ends
count.write_text("x" * (n + 1))
what, old, new = edits[n]
train = pathlib.Path("train.py")
train.write_text(train.read_text().replace(old, new))
pathlib.Path(os.environ["GPUSWARM_MESSAGE_FILE"]).write_text(what + "\\n")
"""


def research(gpuswarm: Cli, repo: Path, *args: str, timeout: float = 90) -> Any:
    res = gpuswarm("research", args[0], "-C", repo, *args[1:], "--json", timeout=timeout)
    assert res.returncode == 0, str(res)
    return json.loads(res.stdout)


def loop(gpuswarm: Cli, tmp: Path, repo: Path, name: str, edits: list[Any], *flags: str) -> str:
    agent = tmp / f"{name}.py"
    agent.write_text(AGENT_PY.format(edits=edits, count=str(tmp / f"{name}.count")))
    res = gpuswarm(
        "research", "loop", "-C", repo, "--proposer", "agent", "--agent-command",
        f"{shlex.quote(PY)} {shlex.quote(str(agent))}", "--agent-max-failures", "1",
        "--controls", "off", "--plain", *flags, timeout=150,
    )  # fmt: skip
    assert "agent exited 3" in res.output, str(res)
    research(gpuswarm, repo, "wait")
    return res.output


@pytest.mark.timeout(300)
def test_prune_a_clear_loser_replay_and_rerun(gpuswarm: Cli, tmp_path: Path) -> None:
    repo = make_research_repo(tmp_path / "repo", TRAIN_PY.format(counter=str(tmp_path / "runs")))
    res = gpuswarm(
        "research", "init", "-C", repo, "--tag", TAG, "--edit", "train.py", "--command",
        f"{shlex.quote(PY)} train.py", "--gpus", "sim:2", "--timeout", "30s", "--linger", "3s",
        "--mode", "async", "--baseline-repeats", "3", "--noise-confirm", "0",
    )  # fmt: skip
    assert res.returncode == 0, str(res)

    # 1. no pruning: a clear loser and a no-op run in full
    edits = [("LR to 0.9", "LR = 0.04", "LR = 0.9"), ("a comment", "LR = 0.04", "LR = 0.04  # x")]
    loop(gpuswarm, tmp_path, repo, "a1", edits)
    ledger = research_ledger(repo, TAG)
    ids = {e["description"]: e["id"] for e in ledger if e["ev"] == "variant"}
    bad1, noop = ids["LR to 0.9"], ids["a comment"]
    curves = {e["id"]: e.get("curve") or [] for e in ledger if e["ev"] == "finished"}
    assert all(len(c) == 20 for c in curves.values()), curves  # every run recorded its curve

    # 2. the replay says what --prune median would have stopped: the loser only
    replay = research(gpuswarm, repo, "log", "--policy", "noise-aware", "--prune", "median")
    pruning = replay["pruning"]
    assert pruning["would_prune"] == [bad1], pruning
    assert pruning["gpu_saved_s"] > 0 and pruning["best_changed"] is False, pruning
    assert pruning["curves"] == 5, pruning  # 3 baselines and 2 variants recorded theirs
    rows = {r["id"]: r for r in replay["variants"]}
    assert (rows[bad1]["recorded"], rows[bad1]["replayed"]) == ("discard", "pruned")
    assert rows[noop]["replayed"] == rows[noop]["recorded"] == "discard"
    plain = gpuswarm("research", "log", "-C", repo, "--policy", "noise-aware", "--prune", "curve")
    assert plain.returncode == 0 and f"would stop 1: {bad1}" in plain.stdout, str(plain)

    # 3. with --prune median the next clear loser is stopped early: its row says pruned
    out = loop(gpuswarm, tmp_path, repo, "a2", [("LR to 0.8", "LR = 0.04", "LR = 0.8")],
               "--prune", "median")  # fmt: skip
    ledger = research_ledger(repo, TAG)
    bad2 = next(e["id"] for e in ledger if e["ev"] == "variant" and e["description"] == "LR to 0.8")
    assert f"{bad2} stopped: pruned at" in out, out
    decided = {e["id"]: e for e in ledger if e["ev"] == "decided"}
    assert decided[bad2]["status"] == "pruned", decided[bad2]
    fin = next(e for e in ledger if e["ev"] == "finished" and e["id"] == bad2)
    assert fin["pruned"]["rule"] == "median" and len(fin["curve"]) < 20, fin
    row = next(r for r in research_results(repo, TAG) if "LR to 0.8" in r[4])
    assert row[1:4] == ["0.000000", "0.0", "pruned"] and "(pruned at " in row[4], row
    assert re.search(r"val_bpb 3\.\d{6}, BASE 1\.\d{6} \+ 3 x noise", row[4]), row  # last value
    status = research(gpuswarm, repo, "status")
    assert status["pruned"] == 1 and status["crashed"] == 0, status
    assert status["gpu_saved_s"] >= 0
    files = research(gpuswarm, repo, "report")
    assert "1 pruned (GPU time saved" in Path(files["report"]).read_text()
    shown = gpuswarm("research", "status", "-C", repo)
    assert "1 pruned (GPU time saved" in shown.stdout, str(shown)
    served = start_dashboard(repo, cwd=tmp_path, log_dir=tmp_path / "_dash_logs")  # the real CLI
    try:
        eid = wait_for(lambda: (x := served.get("/api/runs")["experiments"]) and x[0]["id"], 20)
        view = served.get(f"/api/experiments/{eid}")["view"]
        browser_shows(served.url, eid, bad2, tmp_path / "chromium-profile")
    finally:
        assert served.process is not None
        served.process.kill_group()
        served.close()
    assert (view["pruned"], view["gpu_saved_s"]) == (1, status["gpu_saved_s"]), view
    shown_rows = {r["id"]: r for r in view["rows"]}
    assert shown_rows[bad2]["status"] == "pruned" and shown_rows[bad2]["metric"] is None

    # 4. --rerun runs it again in full: a normal result, never pruned
    again = research(gpuswarm, repo, "try", "--rerun", bad2)
    assert again["rerun"] == bad2
    research(gpuswarm, repo, "wait")
    ledger = research_ledger(repo, TAG)
    decided = {e["id"]: e for e in ledger if e["ev"] == "decided"}
    assert decided[again["id"]]["status"] == "discard", decided[again["id"]]
    fin = next(e for e in ledger if e["ev"] == "finished" and e["id"] == again["id"])
    assert fin["ok"] and len(fin["curve"]) == 20 and fin["metric"] > 2.5, fin
    research(gpuswarm, repo, "stop")


WAIT_MS = 15_000  # DOM polls: generous (a loaded 2-core machine), never a timing assertion


def browser_shows(url: str, eid: str, pruned: str, profile: Path) -> None:
    """The dashboard in a real browser: the pruned count with the GPU time saved in the
    header, the pruned row in the table, its triangle on the chart (not a crash's cross)."""
    if browser_missing() is not None:
        require_browser()  # skips here, fails under CI
    with browser_context(profile) as ctx:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url)
        page.wait_for_selector(f"[data-exp='{eid}'] a", timeout=WAIT_MS)
        page.click(f"[data-exp='{eid}'] a")
        stat = page.locator("[data-stat=pruned]")
        stat.wait_for(timeout=WAIT_MS)
        assert re.fullmatch(r"1 \(GPU time saved [^)]+\)\s*pruned", stat.inner_text()), stat
        row = page.locator(f"[data-testid=exp-rows] tr[data-variant='{pruned}']")
        row.wait_for(timeout=WAIT_MS)
        assert "pruned" in row.inner_text(), row.inner_text()
        chart = page.locator(f"[data-testid=chart] path.pruned[data-variant='{pruned}']")
        chart.wait_for(timeout=WAIT_MS)
        assert page.locator(f"[data-testid=chart] path.crash[data-variant='{pruned}']").count() == 0
        assert not errors, errors
