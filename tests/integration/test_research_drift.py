"""Issue 29, item 1: decisions that hold on a drifting machine (paired BASE controls).

The toys' metric moves by a fixed amount with every run, whatever the code (a machine whose
load drifts): each run takes the next number from a counter shared by every run. An agent
proposer (a script) makes four no-op variants (a comment) and one real change (LR 0.04 ->
0.05: 0.01 better). Compared with BASE's runs from the start, the improving toy's no-ops
"win"; paired with the control runs of their own period, none is kept and the real change is,
under the default policy, on a toy that improves over time and on one that worsens.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult
from integration_support import make_research_repo, research_ledger

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]
PY = sys.executable
TAG = "drift"
STEP = 0.0005  # the drift per run; the real change gains 0.01 (20 steps)

TRAIN_PY = """\
import fcntl
import time

LR = 0.04
with open({counter!r}, "a+") as fh:  # the machine's drift: one step per run, any code
    fcntl.flock(fh, fcntl.LOCK_EX)
    fh.seek(0)
    k = len(fh.read())
    fh.write("x")
time.sleep(0.2)
val = 1.0 + {sign} * {step} * k + (LR - 0.05) ** 2 * 100
print(f"val_bpb: {{val:.6f}}")
"""

AGENT_PY = """\
import os, pathlib, sys
count = pathlib.Path({count!r})
n = len(count.read_text()) if count.exists() else 0
if n >= 5:
    sys.exit(3)  # nothing more to propose: the loop ends
count.write_text("x" * (n + 1))
train = pathlib.Path("train.py")
text = train.read_text()
if n == 2:
    text, what = text.replace("LR = 0.04", "LR = 0.05"), "LR to 0.05"
else:
    text, what = text + f"# no-op {{n}}\\n", f"no-op {{n}}"
train.write_text(text)
pathlib.Path(os.environ["GPUSWARM_MESSAGE_FILE"]).write_text(what + "\\n")
"""


def research(gpuswarm: Cli, repo: Path, *args: str, timeout: float = 60) -> Any:
    res = gpuswarm("research", args[0], "-C", repo, *args[1:], "--json", timeout=timeout)
    assert res.returncode == 0, str(res)
    return json.loads(res.stdout)


def run_toy(gpuswarm: Cli, tmp: Path, sign: int, mode: str, controls: str) -> dict[str, Any]:
    counter = tmp / "runs-so-far"
    repo = make_research_repo(
        tmp / "repo", TRAIN_PY.format(counter=str(counter), sign=sign, step=STEP)
    )
    agent = tmp / "agent.py"
    agent.write_text(AGENT_PY.format(count=str(tmp / "proposals")))
    res = gpuswarm(
        "research", "init", "-C", repo, "--tag", TAG, "--edit", "train.py", "--command",
        f"{shlex.quote(PY)} train.py", "--gpus", "sim:4", "--timeout", "30s", "--linger", "3s",
        "--mode", mode,
    )  # fmt: skip
    assert res.returncode == 0, str(res)
    loop = gpuswarm(
        "research", "loop", "-C", repo, "--mode", mode, "--proposer", "agent",
        "--agent-command", f"{shlex.quote(PY)} {shlex.quote(str(agent))}",
        "--agent-max-failures", "1", "--controls", controls, "--plain", timeout=150,
    )  # fmt: skip
    assert "agent exited 3" in loop.output, str(loop)
    research(gpuswarm, repo, "wait", timeout=90)  # whatever the loop left in flight
    ledger = research_ledger(repo, TAG)
    variants = {e["id"]: e for e in ledger if e["ev"] == "variant"}
    decided = {e["id"]: e for e in ledger if e["ev"] == "decided"}
    status = research(gpuswarm, repo, "status")
    replayed = research(gpuswarm, repo, "log", "--policy", "noise-aware")
    research(gpuswarm, repo, "stop")
    return {"variants": variants, "decided": decided, "status": status, "replayed": replayed}


def outcomes(data: dict[str, Any]) -> dict[str, str]:
    """Each proposal's final word: its own decision, or its re-based combination's."""
    variants, decided = data["variants"], data["decided"]
    out = {}
    for vid, v in variants.items():
        if v["kind"] != "variant":
            continue
        status = decided[vid]["status"]
        combo = next(
            (c for c in variants.values() if c.get("origin") == vid and c["kind"] == "combo"), None
        )
        if combo is not None:
            status = decided[combo["id"]]["status"]
        out[v["description"]] = status
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("sign", "mode", "controls"),
    [(-1, "async", "2"), (1, "rounds", "auto")],  # rounds, the default: one control a round
    ids=["improving-async", "worsening-rounds"],
)
def test_no_op_variants_are_never_kept_on_a_drifting_machine(
    gpuswarm: Cli, tmp_path: Path, sign: int, mode: str, controls: str
) -> None:
    data = run_toy(gpuswarm, tmp_path, sign, mode, controls)
    got = outcomes(data)
    assert len(got) == 5, got
    assert got["LR to 0.05"] == "keep", (got, data["decided"])
    assert [d for d, s in got.items() if d.startswith("no-op") and s == "keep"] == [], got
    kinds = [v["kind"] for v in data["variants"].values()]
    assert kinds.count("control") >= 2, kinds  # decisions were paired with controls
    noise = data["status"]["noise"]
    assert noise and noise[0]["paired"] is True, noise
    drift = data["status"]["drift"]
    assert drift and drift[0]["change"] * sign > 0, drift  # the controls saw the machine move
    # `research log --policy` replays the paired rule: the same policy keeps the same changes
    replayed = data["replayed"]
    assert replayed["would_keep"] == replayed["kept"], replayed
