"""Regression tests from a night of research loops on a real training script (nanoGPT style).

Each test gets its own git repository and drives the real CLI in subprocesses on simulated GPUs.
Runs that must finish in a given order wait for a gate file the test creates (no timing).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, wait_for
from integration_support import edit_constant, git, research_ledger, research_results

pytestmark = pytest.mark.slow

PY = sys.executable
Cli = Callable[..., CliResult]
TAG = "t"
BRANCH = f"autoresearch/{TAG}"


# -- helpers -----------------------------------------------------------------------------------
def exp_dir(repo: Path) -> Path:
    return repo / ".gpuswarm" / "research" / TAG


def ledger(repo: Path) -> list[dict[str, Any]]:
    return research_ledger(repo, TAG)


def events(repo: Path, ev: str) -> list[dict[str, Any]]:
    return [e for e in ledger(repo) if e.get("ev") == ev]


def variants(repo: Path) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in events(repo, "variant")}


def decided(repo: Path) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in events(repo, "decided")}


def init(gpuswarm: Cli, repo: Path, *extra: str, gpus: str = "sim:2") -> CliResult:
    res = gpuswarm(
        "research",
        "init",
        "-C",
        repo,
        "--tag",
        TAG,
        "--edit",
        "train.py",
        "--command",
        f"{shlex.quote(PY)} train.py",
        "--gpus",
        gpus,
        "--timeout",
        "20s",
        "--linger",
        "2s",
        "--baseline-repeats",  # one baseline run, as the seed's first round (pinned rows)
        "1",
        *extra,
    )
    assert res.returncode == 0, res
    return res


def research(gpuswarm: Cli, repo: Path, *args: str | Path, timeout: float = 60) -> CliResult:
    return gpuswarm("research", args[0], "-C", repo, *args[1:], timeout=timeout)


def ok_json(res: CliResult) -> Any:
    assert res.returncode == 0, res
    return json.loads(res.stdout)


def try_edit(gpuswarm: Cli, repo: Path, message: str, **constants: str) -> dict[str, Any]:
    for name, value in constants.items():
        edit_constant(repo, name, value)
    data: dict[str, Any] = ok_json(research(gpuswarm, repo, "try", "-m", message, "--json"))
    return data


def wait_decided(gpuswarm: Cli, repo: Path, vid: str, timeout: float = 40) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        research(gpuswarm, repo, "status", "--json")  # settles
        return decided(repo).get(vid)

    found: dict[str, Any] = wait_for(done, timeout, interval=0.3, what=f"{vid} decided")
    return found


def stop(gpuswarm: Cli, repo: Path) -> None:
    assert research(gpuswarm, repo, "stop").returncode == 0


def branch_tip(repo: Path) -> str:
    return git(repo, "rev-parse", f"refs/heads/{BRANCH}")


def show(repo: Path, rev: str, path: str = "train.py") -> str:
    return git(repo, "show", f"{rev}:{path}")


# A train.py whose runs of the variants named in GATED wait for a gate file of that name, and
# whose metric improves with the variant number (the noise of real runs: a later run of the same
# code can measure better).
GATED_TRAIN = """\
import os
import sys
import time
from pathlib import Path

LR = 0.04
# depth
DEPTH = 8
# gates
GATES = {gates!r}
GATED = {gated!r}

VID = os.environ.get("GPUSWARM_VARIANT", "v0000")
while VID in GATED and not (Path(GATES) / VID).exists():
    time.sleep(0.05)
val = 0.9 + (LR - 0.05) ** 2 * 100 + abs(DEPTH - 6) * 0.01 - 0.05 * int(VID[1:])
print("---")
print(f"val_bpb:          {{val:.6f}}")
print("training_seconds: 0.1")
print("peak_vram_mb:     1024.0")
"""


def gated_repo(repo: Path, gates: Path, gated: tuple[str, ...]) -> None:
    gates.mkdir(exist_ok=True)
    (repo / "train.py").write_text(GATED_TRAIN.format(gates=str(gates), gated=list(gated)))
    git(repo, "commit", "-q", "-am", "gated runs")


def release(gates: Path, vid: str) -> None:
    (gates / vid).write_text("go\n")


# -- 1. twins: identical code is never run or kept ---------------------------------------------
def test_try_refuses_a_twin_of_a_queued_variant(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    init(gpuswarm, repo, "--policy", "manual")
    try:
        first = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        edit_constant(repo, "LR", "0.05")
        res = research(gpuswarm, repo, "try", "-m", "LR to 0.05 again")
        assert res.returncode == 2, res
        assert first["id"] in res.stderr and "identical" in res.stderr, res
        assert "LR = 0.05\n" in (repo / "train.py").read_text()  # the edit is left alone
        res = research(gpuswarm, repo, "try", "-m", "same again", "--from", first["id"])
        assert res.returncode == 2, res
        assert first["id"] in res.stderr, res
        assert list(variants(repo)) == ["v0001", first["id"]]  # the baseline and the first
        assert research(gpuswarm, repo, "restore").returncode == 0
    finally:
        stop(gpuswarm, repo)


@pytest.mark.timeout(90)
def test_async_rebase_that_only_repeats_base_is_not_rerun(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path
) -> None:
    repo, gates = research_repo, tmp_path / "gates"
    gated_repo(repo, gates, ("v0002", "v0003"))
    init(gpuswarm, repo, "--mode", "async")
    try:
        assert research(gpuswarm, repo, "baseline").returncode == 0
        wait_decided(gpuswarm, repo, "v0001")
        both = try_edit(gpuswarm, repo, "LR 0.05 and DEPTH 6", LR="0.05", DEPTH="6")
        lr_only = try_edit(gpuswarm, repo, "LR 0.05", LR="0.05")
        assert (both["id"], lr_only["id"]) == ("v0002", "v0003")
        release(gates, "v0002")
        assert wait_decided(gpuswarm, repo, "v0002")["status"] == "keep"
        release(gates, "v0003")
        # v0003 measures better (noise), but on the new BASE its change is already there
        d = wait_decided(gpuswarm, repo, "v0003")
        assert d["status"] == "discard", d
        assert "already part of BASE" in d["reason"], d
        status = ok_json(research(gpuswarm, repo, "status", "--json"))
        assert status["in_flight"] == []
        assert [v["kind"] for v in variants(repo).values()] == ["baseline", "variant", "variant"]
        assert branch_tip(repo) == both["commit"]
        table = research_results(repo, TAG)[1:]
        assert [r[3] for r in table] == ["keep", "keep", "discard"], table
    finally:
        stop(gpuswarm, repo)


@pytest.mark.timeout(90)
def test_mutate_never_proposes_a_twin_of_a_manual_variant(
    gpuswarm: Cli, research_repo: Path
) -> None:
    from gpuswarm.research import proposers
    from gpuswarm.research.session import Experiment

    repo = research_repo
    (repo / "train.py").write_text("LR = 0.04\n")
    git(repo, "commit", "-q", "-am", "one knob")
    init(gpuswarm, repo, "--policy", "manual")
    try:
        exp = Experiment.open(repo, TAG)
        state = exp.settle()
        proposer = proposers.MutateProposer(exp.paths, exp.cfg, seed=0)
        options: set[bytes] = set()
        while (p := proposer.propose(state)) is not None:
            options.add(p.files["train.py"] or b"")
        assert len(options) >= 4
        # one of them made by hand: mutate (a fresh one) does not offer it again
        made = sorted(options)[0]
        (repo / "train.py").write_bytes(made)
        try_data = ok_json(research(gpuswarm, repo, "try", "-m", "by hand", "--json"))
        state = exp.settle()
        fresh = proposers.MutateProposer(exp.paths, exp.cfg, seed=0)
        offered: set[bytes] = set()
        while (p := fresh.propose(state)) is not None:
            offered.add(p.files["train.py"] or b"")
        assert offered == options - {made}, try_data
    finally:
        stop(gpuswarm, repo)


# -- 2. the working tree follows keeps only where gpuswarm wrote it ----------------------------
def test_files_follow_keeps_after_the_user_commits_on_the_branch(
    gpuswarm: Cli, research_repo: Path
) -> None:
    repo = research_repo
    init(gpuswarm, repo)
    try:
        edit_constant(repo, "LR", "0.045")  # the user's own commit on the experiment branch
        git(repo, "commit", "-q", "-am", "LR 0.045 by hand")
        mine = git(repo, "rev-parse", "HEAD")
        tried = try_edit(gpuswarm, repo, "DEPTH to 6", DEPTH="6")
        assert tried["parent"] == mine, tried
        assert git(repo, "status", "--porcelain") == ""
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        assert waited["timed_out"] is False
        assert branch_tip(repo) == tried["commit"]  # kept (DEPTH 6 is better)
        assert (repo / "train.py").read_text().rstrip("\n") == show(repo, tried["commit"])
        assert git(repo, "status", "--porcelain") == ""  # files, index and HEAD agree
        status = ok_json(research(gpuswarm, repo, "status", "--json"))
        assert status["files"]["case"] == "following", status["files"]
        # an edit in progress is never overwritten by a keep, and status says so
        edit_constant(repo, "DEPTH", "7")
        status = ok_json(research(gpuswarm, repo, "status", "--json"))
        assert status["files"]["case"] == "edited", status["files"]
        assert "train.py" in status["files"]["message"]
    finally:
        stop(gpuswarm, repo)


def test_keeps_never_touch_another_branchs_files(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    init(gpuswarm, repo, "--no-checkout")
    master_train = (repo / "train.py").read_text()
    try:
        tried = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        assert (repo / "train.py").read_text() == master_train  # put back as it was
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        assert waited["timed_out"] is False
        assert branch_tip(repo) == tried["commit"]  # kept
        assert git(repo, "symbolic-ref", "--short", "HEAD") == "master"
        assert (repo / "train.py").read_text() == master_train
        assert git(repo, "status", "--porcelain") == ""
        assert waited["files"]["case"] == "other-branch", waited["files"]
        assert "master" in waited["files"]["message"]
        # master moves on (a file outside the experiment) and an edit is made there: it is
        # measured as that edit of train.py carried onto BASE, and nothing else of master's
        (repo / "README.md").write_text("# master moved on\n")
        git(repo, "commit", "-q", "-am", "master moves on")
        kept = branch_tip(repo)
        tried = try_edit(gpuswarm, repo, "SLEEP to 0.25", SLEEP="0.25")
        source = show(repo, tried["commit"])
        assert "LR = 0.05\n" in source + "\n" and "SLEEP = 0.25\n" in source + "\n", source
        assert tried["parent"] == kept
        assert git(repo, "diff", "--name-only", kept, tried["commit"]) == "train.py"
        assert (repo / "train.py").read_text() == master_train
    finally:
        stop(gpuswarm, repo)


# -- 3. mutate on a nanoGPT-style script ---------------------------------------------------------
NANO_TRAIN = """\
import time

# I/O
out_dir = "out"
eval_interval = 250
log_interval = 10
# data
batch_size = 64
block_size = 256
# model
n_layer = 6
n_embd = 384
dropout = 0.2
bias = False
# adamw optimizer
learning_rate = 1e-3
max_iters = 5000
betas = (0.9, 0.99)
tokens_per_iter = 2**16
flops_promised = 312e12  # A100 bf16 peak: only for the MFU printout
exec(open("configurator.py").read())  # overrides from the command line or a config file

t0 = time.time()
loss = 1.5 + (learning_rate - 2e-3) ** 2 * 1e4 + abs(n_embd - 256) / 1000 + dropout * 0.1
loss += abs(betas[1] - 0.95) + abs(tokens_per_iter - 2**15) / 1e6 + block_size / 1e5
loss += n_layer * batch_size * max_iters / 1e6 + (eval_interval + log_interval) / 1e7
for it in range(3):
    print(f"iter {it}: loss {loss + 1 - it * 0.1:.4f}, mfu {100 * 1e9 / flops_promised:.2f}%")
print("---")
print(f"val_loss:         {loss:.6f}")
print(f"training_seconds: {time.time() - t0:.1f}")
print(f"peak_vram_mb:     {n_layer * n_embd / 10:.1f}")
print(f"num_steps:        {max_iters}")
"""

CONFIGURATOR = """\
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if "=" not in arg:
        config_file = arg
        print(f"Overriding config with {config_file}:")
        exec(open(config_file).read())
    else:
        key, val = arg.split("=")
        key = key[2:]
        assert key in globals(), f"Unknown config key: {key}"
        globals()[key] = literal_eval(val)
"""

TINY_CONFIG = "# a tiny run on CPU\nn_layer = 2\nbatch_size = 8\nmax_iters = 20\n"


def nano_repo(root: Path) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "master")
    git(root, "config", "user.email", "test@example.com")
    git(root, "config", "user.name", "test")
    (root / "train.py").write_text(NANO_TRAIN)
    (root / "configurator.py").write_text(CONFIGURATOR)
    (root / "config").mkdir()
    (root / "config" / "train_tiny.py").write_text(TINY_CONFIG)
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "nanoGPT-style")
    return root


def nano_init(gpuswarm: Cli, repo: Path, *extra: str) -> None:
    res = gpuswarm(
        "research",
        "init",
        "-C",
        repo,
        "--tag",
        TAG,
        "--edit",
        "train.py",
        "--protect",
        "configurator.py",
        "--command",
        f"{shlex.quote(PY)} train.py config/train_tiny.py --dropout=0.1",
        "--metric",
        "val_loss",
        "--gpus",
        "sim:2",
        "--timeout",
        "20s",
        "--linger",
        "2s",
        *extra,
    )
    assert res.returncode == 0, res


@pytest.mark.timeout(120)
def test_loop_mutate_on_a_nanogpt_style_script(
    gpuswarm: Cli, tmp_path: Path, run_reaper: None
) -> None:
    repo = nano_repo(tmp_path / "nano")
    nano_init(gpuswarm, repo, "--mode", "async")
    res = gpuswarm(
        "research", "loop", "-C", repo, "--max-experiments", "4", "--seed", "2", timeout=100
    )
    try:
        assert res.returncode == 0, res
        made = [v for v in variants(repo).values() if v["kind"] == "variant"]
        assert len(made) >= 3 and all(v["source"] == "mutate" for v in made), made
        # set at run time by the config file or --dropout=: changing them in train.py is moot;
        # flops_promised only feeds a printout
        moot = {"n_layer", "batch_size", "max_iters", "dropout", "flops_promised"}
        allowed = {
            "eval_interval",
            "log_interval",
            "block_size",
            "n_embd",
            "learning_rate",
            "betas[0]",
            "betas[1]",
            "tokens_per_iter",
        }
        finished = {e["id"]: e for e in events(repo, "finished")}
        for v in made:
            names = {change[0] for change in v["meta"]["changes"]}
            assert names and names <= allowed and not names & moot, v
            diff = git(repo, "diff", "-U0", v["parent"], v["commit"], "--", "train.py")
            changed = [ln for ln in diff.splitlines() if ln.startswith("+") and "+++" not in ln]
            assert changed and all(ln[1].islower() for ln in changed), diff
            if v["id"] in finished:  # it ran: the summary block was read
                fin = finished[v["id"]]
                assert fin["ok"], fin
                assert fin["summary"]["num_steps"] == 20.0  # the config file's max_iters
        assert sum(1 for v in made if v["id"] in finished) >= 3
        table = research_results(repo, TAG)
        assert table[0][1] == "val_loss"
        assert len(table) - 1 == len(decided(repo)) >= 5  # the baseline and the variants
    finally:
        stop(gpuswarm, repo)


def test_loop_with_nothing_to_mutate_exits_2_saying_why(
    gpuswarm: Cli, tmp_path: Path, run_reaper: None
) -> None:
    repo = tmp_path / "plain"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "master")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    (repo / "train.py").write_text(
        'name = "gpt"\nuse_amp = True\nflops = 1e12\nprint(f"{flops}")\nprint("val_bpb: 1.0")\n'
    )
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "no knobs")
    init(gpuswarm, repo)
    try:
        res = research(gpuswarm, repo, "loop", "--max-experiments", "2")
        assert res.returncode == 2, res
        assert "nothing to propose" in res.stderr and "flops" in res.stderr, res
        assert "--mutate" in res.stderr, res
        res = research(gpuswarm, repo, "loop", "--max-experiments", "2", "--mutate", "lr")
        assert res.returncode == 2, res
        assert "--mutate lr" in res.stderr and "flops" in res.stderr, res
        assert variants(repo) == {}
        # named explicitly, a print-only setting is mutated anyway: the user knows better
        res = research(
            gpuswarm, repo, "loop", "--max-experiments", "1", "--mutate", "flops", timeout=60
        )
        assert res.returncode == 0, res
        made = [v for v in variants(repo).values() if v["source"] == "mutate"]
        assert len(made) == 1 and made[0]["meta"]["changes"][0][0] == "flops", made
    finally:
        stop(gpuswarm, repo)


# -- issue 12: settings a runner cannot use -----------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("metric_pattern", "val_bpb: ([", "--metric-regex"),
        ("memory_pattern", "(*)", "--memory-regex"),
        ("command", "python3 'x", "command"),
        ("timeout", 30 * 86400, "timeout"),
    ],
)
def test_stored_settings_a_runner_cannot_use_are_reported(
    gpuswarm: Cli, research_repo: Path, field: str, value: object, needle: str
) -> None:
    repo = research_repo
    init(gpuswarm, repo)
    settings = exp_dir(repo) / "experiment.json"
    data = json.loads(settings.read_text())
    data[field] = value  # as an older gpuswarm (or a hand edit) stored it
    settings.write_text(json.dumps(data))
    edit_constant(repo, "LR", "0.05")
    for args in (("try", "-m", "LR 0.05"), ("status",), ("wait", "--timeout", "1s")):
        res = research(gpuswarm, repo, *args)
        assert res.returncode == 2, res
        assert "Traceback" not in res.stderr, res
        assert "experiment.json" in res.stderr and needle in res.stderr, res
    assert variants(repo) == {}
    # the runner itself, started by hand, says what is wrong and exits: no traceback
    res = gpuswarm("research", "_serve", exp_dir(repo), cwd=repo)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res
    assert needle in res.stderr, res


# -- 4. --link adds to .venv ---------------------------------------------------------------------
def test_link_adds_to_the_default_venv_link(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    tool = repo / ".venv" / "bin" / "train"
    tool.parent.mkdir(parents=True)
    tool.write_text('#!/bin/sh\nexec "$(cat data/python)" train.py\n')
    tool.chmod(0o755)
    (repo / "data").mkdir()
    (repo / "data" / "python").write_text(PY)
    exclude = repo / ".git" / "info" / "exclude"
    exclude.write_text(exclude.read_text() + "/.venv/\n/data/\n")
    res = gpuswarm(
        "research", "init", "-C", repo, "--tag", TAG, "--edit", "train.py", "--link", "data",
        "--command", ".venv/bin/train", "--gpus", "sim:2", "--timeout", "20s", "--linger", "2s",
    )  # fmt: skip
    assert res.returncode == 0, res
    settings = json.loads((exp_dir(repo) / "experiment.json").read_text())
    assert settings["link"] == [".venv", "data"]
    try:
        tried = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        got = {v["id"]: v for v in waited["finished"]}
        assert got[tried["id"]]["status"] == "keep", got  # it ran: .venv and data were there
        assert got["v0001"]["metric"] is not None, got
    finally:
        stop(gpuswarm, repo)


# -- 5, 6. why a run crashed, and every field of the ledger ---------------------------------------
def test_crash_reason_names_the_failing_line_and_log_json_has_every_field(
    gpuswarm: Cli, research_repo: Path
) -> None:
    repo = research_repo
    init(gpuswarm, repo)
    try:
        with (repo / "train.py").open("a") as fh:
            fh.write("def broken(:\n")
        crash = ok_json(research(gpuswarm, repo, "try", "-m", "a syntax error", "--json"))
        fine = try_edit(gpuswarm, repo, "DEPTH to 6", DEPTH="6")
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        got = {v["id"]: v for v in waited["finished"]}
        assert got[crash["id"]]["status"] == "crash"
        assert "SyntaxError" in got[crash["id"]]["reason"], got[crash["id"]]
        log_path = Path(got[crash["id"]]["log_path"])
        assert log_path.is_absolute() and "SyntaxError" in log_path.read_text()
        (row,) = [r for r in research_results(repo, TAG)[1:] if r[0] == crash["commit"][:7]]
        assert "SyntaxError" in row[4], row
        text = research(gpuswarm, repo, "status").stdout
        assert "SyntaxError" in text, text

        logged = ok_json(research(gpuswarm, repo, "log", "--json"))
        by_id = {v["id"]: v for v in logged["variants"]}
        ok = by_id[fine["id"]]
        assert ok["host"] and ok["started"] and ok["ended"] and ok["ended"] >= ok["started"]
        assert ok["summary"]["training_seconds"] == 0.2 and ok["summary"]["depth"] == 6.0
        assert ok["diff"]["insertions"] == 1 and ok["diff"]["deletions"] == 1
        assert ok["decision"]["status"] in ("keep", "discard")
        assert "SyntaxError" in by_id[crash["id"]]["tail"]
        assert Path(by_id[crash["id"]]["log_path"]) == log_path
    finally:
        stop(gpuswarm, repo)


# -- 8, 9. a loop's mode is that loop's; wait does not repeat what the loop reported -------------
@pytest.mark.timeout(90)
def test_loop_mode_applies_to_the_loop_and_wait_reports_only_new(
    gpuswarm: Cli, research_repo: Path
) -> None:
    repo = research_repo
    init(gpuswarm, repo)  # rounds: the default for manual use
    try:
        res = research(
            gpuswarm, repo, "loop", "--mode", "async", "--max-experiments", "2", "--seed", "1",
            "--controls", "off",  # the ids this test pins are the variants' (no control run)
            timeout=80,
        )  # fmt: skip
        assert res.returncode == 0, res
        assert events(repo, "mode")[-1]["mode"] == "rounds"
        assert ok_json(research(gpuswarm, repo, "status", "--json"))["mode"] == "rounds"
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "10s"))
        assert waited["finished"] == [], waited  # the loop printed them already
        tried = try_edit(gpuswarm, repo, "DEPTH to 7", DEPTH="7")
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        assert [v["id"] for v in waited["finished"]] == [tried["id"]]
        (row,) = [r for r in research_results(repo, TAG)[1:] if r[0] == tried["commit"][:7]]
        assert row[4].startswith(f"[R{tried['round']} gpu"), row  # round semantics again
    finally:
        stop(gpuswarm, repo)


# -- 10. one row per variant; the best measured is shown --------------------------------------
def test_keep_by_hand_of_a_discard_replaces_its_row(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    init(gpuswarm, repo, "--policy", "manual")
    try:
        worse = try_edit(gpuswarm, repo, "DEPTH to 20", DEPTH="20")
        better = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        assert ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        assert research(gpuswarm, repo, "discard", worse["id"]).returncode == 0
        assert research(gpuswarm, repo, "keep", worse["id"]).returncode == 0  # overrides it
        table = research_results(repo, TAG)[1:]
        assert [r[0] for r in table].count(worse["commit"][:7]) == 1, table
        assert len(table) == 2 and table[-1][3] == "keep", table
        status = ok_json(research(gpuswarm, repo, "status", "--json"))
        # one definition of kept (issue 29.4): the changes that became BASE, not the baseline row
        assert status["experiments"] == 2 and status["kept"] == 1, status
        # BASE is the worse one now (kept by hand); the best measured is still shown
        assert status["best_recorded"]["id"] == better["id"], status  # measured, undecided
        assert status["best"] > status["best_recorded"]["metric"]
    finally:
        stop(gpuswarm, repo)


# -- 7. research config ----------------------------------------------------------------------
def test_config_shows_and_changes_settings_for_new_variants(
    gpuswarm: Cli, research_repo: Path
) -> None:
    repo = research_repo
    init(gpuswarm, repo, "--policy", "manual")
    try:
        shown = ok_json(research(gpuswarm, repo, "config", "--json"))
        assert shown["settings"]["timeout"] == 20.0 and shown["changed"] == {}
        bad = research(gpuswarm, repo, "config", "--command", "python3 'x")
        assert bad.returncode == 2 and "command" in bad.stderr, bad
        bad = research(gpuswarm, repo, "config", "--metric-regex", "([")
        assert bad.returncode == 2 and "--metric-regex" in bad.stderr, bad
        assert ok_json(research(gpuswarm, repo, "config", "--json"))["changed"] == {}
        changed = ok_json(
            research(gpuswarm, repo, "config", "--timeout", "45s", "--policy", "greedy", "--json")
        )
        assert changed["changed"] == {"timeout": [20.0, 45.0], "policy": ["manual", "greedy"]}
        (event,) = events(repo, "config")
        assert event["changes"]["timeout"] == [20.0, 45.0]
        tried = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        got = {v["id"]: v for v in waited["finished"]}
        assert got[tried["id"]]["status"] == "keep"  # greedy now decides by itself
        run = next((exp_dir(repo) / "queue").glob("run_*"))
        (desc,) = (run / ".parallel" / "done").glob(f"*{tried['id']}*")
        assert json.loads(desc.read_text())["task"]["timeout"] == 45.0
    finally:
        stop(gpuswarm, repo)


def test_config_fixes_a_stored_setting_a_runner_cannot_use(
    gpuswarm: Cli, research_repo: Path
) -> None:
    repo = research_repo
    init(gpuswarm, repo)
    settings = exp_dir(repo) / "experiment.json"
    data = json.loads(settings.read_text())
    data["metric_pattern"] = "val_bpb: (["
    settings.write_text(json.dumps(data))
    assert research(gpuswarm, repo, "status").returncode == 2
    res = research(gpuswarm, repo, "config", "--metric-regex", r"^val_bpb:\s*([0-9.]+)")
    assert res.returncode == 0, res
    assert research(gpuswarm, repo, "status").returncode == 0


# -- 12. withdrawing a queued variant ------------------------------------------------------------
def test_discard_withdraws_a_queued_variant(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path
) -> None:
    repo, gates = research_repo, tmp_path / "gates"
    gated_repo(repo, gates, ("v0001", "v0002"))
    init(gpuswarm, repo, gpus="sim:1")  # one slot: v0001 runs (gated), the others wait
    try:
        running = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        queued = try_edit(gpuswarm, repo, "DEPTH to 6", DEPTH="6")
        run = next((exp_dir(repo) / "queue").glob("run_*"))
        leases = run / ".parallel" / "running"
        wait_for(lambda: [p for p in leases.iterdir() if p.name[:1] != "."], 20, what="a claim")
        res = research(gpuswarm, repo, "discard", "v0001")  # running: refused, said why
        assert res.returncode == 2 and "running" in res.stderr, res
        out = ok_json(research(gpuswarm, repo, "discard", queued["id"], "--json"))
        assert out["status"] == "withdrawn"
        status = ok_json(research(gpuswarm, repo, "status", "--json"))
        assert queued["id"] not in {v["id"] for v in status["in_flight"]}
        release(gates, "v0001")
        release(gates, "v0002")
        ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        table = research_results(repo, TAG)[1:]
        assert queued["commit"][:7] not in [r[0] for r in table], table  # it measured nothing
        assert len(table) == 2, table  # the baseline and the one that ran
        assert running["id"] in decided(repo) and decided(repo)[queued["id"]]["row"] is None
        assert not list((run / ".parallel" / "pending").iterdir())
        # never run, so trying the same change again is fine
        again = try_edit(gpuswarm, repo, "DEPTH to 6 again", DEPTH="6")
        assert again["commit"] != queued["commit"]
    finally:
        stop(gpuswarm, repo)


# -- 13. a dead runner's leftovers ---------------------------------------------------------------
@pytest.mark.timeout(90)
def test_the_first_command_after_a_dead_runner_owns_its_leftovers(
    gpuswarm: Cli, research_repo: Path
) -> None:
    import psutil
    from integration_support import run_processes

    repo = research_repo
    edit_constant(repo, "SLEEP", "40")  # every run trains for 40 s (the timeout is 60 s)
    git(repo, "commit", "-q", "-am", "long runs")
    res = gpuswarm(
        "research", "init", "-C", repo, "--tag", TAG, "--edit", "train.py", "--command",
        f"{shlex.quote(PY)} train.py", "--gpus", "sim:1", "--timeout", "60s", "--linger", "2s",
    )  # fmt: skip
    assert res.returncode == 0, res
    try:
        assert research(gpuswarm, repo, "baseline").returncode == 0
        run = next((exp_dir(repo) / "queue").glob("run_*"))
        trainers = wait_for(lambda: run_processes(run), 20, what="the baseline training")
        runners = [
            p
            for p in run_processes(exp_dir(repo), var="GPUSWARM_EXPERIMENT")
            if "_serve" in p.cmdline()
        ]
        assert len(runners) == 1, runners
        runners[0].kill()  # the runner dies (with the loop, say); its training runs on
        runners[0].wait(10)
        assert all(p.is_running() for p in trainers)
        status = ok_json(research(gpuswarm, repo, "status", "--json"))
        assert status["runner"] is True, status  # it noticed, and a runner took over

        def orphans_gone() -> bool:
            return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in trainers)

        wait_for(orphans_gone, 20, interval=0.2, what="the orphaned training to be killed")
    finally:
        stop(gpuswarm, repo)


# -- 11. the agent proposer: every attempt journaled, it dies with the loop, links in scratch --
FLAKY_AGENT = r"""
import os, pathlib, re, sys, time
state = pathlib.Path(sys.argv[1])
calls = int(state.read_text()) + 1 if state.exists() else 1
state.write_text(str(calls))
if calls == 1:
    print("the model is overloaded")
    sys.exit(3)
if calls == 2:
    sys.exit(0)  # no edit
assert pathlib.Path("data/tokens.bin").read_bytes() == b"tok"  # the linked data is there
pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))
time.sleep(float(sys.argv[3]))
train = pathlib.Path("train.py")
train.write_text(re.sub(r"(?m)^DEPTH = .*$", "DEPTH = 7", train.read_text()))
pathlib.Path(os.environ["GPUSWARM_MESSAGE_FILE"]).write_text("DEPTH to 7\nthe long story\n")
"""


@pytest.mark.timeout(120)
def test_agent_attempts_are_journaled_and_the_agent_dies_with_the_loop(
    gpuswarm: Cli, gpuswarm_popen: Callable[..., Any], research_repo: Path, tmp_path: Path
) -> None:
    import signal

    from cli_driver import pid_running

    repo = research_repo
    (repo / "data").mkdir()
    (repo / "data" / "tokens.bin").write_bytes(b"tok")
    agent, calls, pidfile = tmp_path / "agent.py", tmp_path / "calls", tmp_path / "agent.pid"
    agent.write_text(FLAKY_AGENT)
    init(gpuswarm, repo, "--link", "data")

    def command(sleep: float) -> str:
        return " ".join(shlex.quote(str(a)) for a in (PY, agent, calls, pidfile, sleep))

    loop = gpuswarm_popen(
        "research", "loop", "-C", repo, "--proposer", "agent", "--agent-command",
        command(60), "--max-experiments", "1",
    )  # fmt: skip
    try:
        pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 40, what="agent"))
        outcomes = [(e["outcome"], e["reason"]) for e in events(repo, "proposal")]
        assert [o for o, _ in outcomes] == ["failed", "failed"], outcomes  # each one journaled
        assert "exited 3" in outcomes[0][1] and "overloaded" in outcomes[0][1], outcomes
        assert "changed none" in outcomes[1][1], outcomes
        assert list((exp_dir(repo) / "scratch").iterdir())  # the agent's scratch copy
        loop.send(signal.SIGKILL)
        loop.wait(10)
        wait_for(lambda: not pid_running(pid), 10, what="the agent to die with the loop")

        calls.write_text("2")  # the next call edits at once
        res = research(
            gpuswarm, repo, "loop", "--proposer", "agent", "--agent-command", command(0),
            "--max-experiments", "1", timeout=80,
        )  # fmt: skip
        assert res.returncode == 0, res
        assert list((exp_dir(repo) / "scratch").iterdir()) == []  # the killed loop's is gone
        made = [e for e in events(repo, "proposal") if e["outcome"] == "made"]
        assert len(made) == 1 and made[0]["description"] == "DEPTH to 7", made  # the first line
        (v,) = [v for v in variants(repo).values() if v["source"] == "agent"]
        assert v["description"] == "DEPTH to 7"
    finally:
        stop(gpuswarm, repo)


# -- smaller things: status --json, errors as JSON, wait's exit, the report ----------------------
def test_status_json_errors_json_wait_exit_and_report(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    init(gpuswarm, repo)
    try:
        crash = try_edit(gpuswarm, repo, "crash on purpose", CRASH="1")
        waited = research(gpuswarm, repo, "wait", "--json", "--timeout", "40s")
        got = {v["id"]: v["status"] for v in json.loads(waited.stdout)["finished"]}
        assert got[crash["id"]] == "crash" and got["v0001"] == "keep", got
        assert waited.returncode == 0, waited  # not every one crashed: the baseline ran
        again = try_edit(gpuswarm, repo, "crash again", CRASH="2")
        res = research(gpuswarm, repo, "wait", "--json", "--timeout", "40s")
        assert [v["id"] for v in json.loads(res.stdout)["finished"]] == [again["id"]]
        assert res.returncode == 1, res  # every variant it waited for crashed
        status = ok_json(research(gpuswarm, repo, "status", "--json"))
        last = {r["id"]: r for r in status["last"]}
        assert last["v0001"]["metric"] == pytest.approx(0.93)
        assert last[crash["id"]]["metric"] is None
        assert isinstance(last["v0001"]["memory_gb"], float)
        for v in status["in_flight"]:
            assert "state" not in v
        bad = research(gpuswarm, repo, "keep", "v0099", "--json")
        assert bad.returncode == 2 and "v0099" in json.loads(bad.stdout)["error"], bad
        report = ok_json(research(gpuswarm, repo, "report", "--json"))
        html = Path(report["report"]).read_text()
        assert "0.930000" in html  # 6 decimals, as results.tsv
        assert 'href="queue/' in html and f"{crash['id']} log" in html  # a crash links its log
    finally:
        stop(gpuswarm, repo)


def test_protect_accepts_a_linked_untracked_file_by_checksum(
    gpuswarm: Cli, research_repo: Path
) -> None:
    repo = research_repo
    (repo / "data").mkdir()
    (repo / "data" / "val.bin").write_bytes(b"\x00validation tokens\x01" * 100)
    res = gpuswarm(
        "research", "init", "-C", repo, "--tag", TAG, "--edit", "train.py", "--link", "data",
        "--protect", "data/val.bin", "--command", f"{shlex.quote(PY)} train.py",
        "--gpus", "sim:1", "--timeout", "20s", "--linger", "2s",
    )  # fmt: skip
    assert res.returncode == 0, res
    try:
        with (repo / "train.py").open("a") as fh:  # a run that writes into the user's data
            fh.write('open("data/val.bin", "ab").write(b"more")\n')
        tamper = ok_json(research(gpuswarm, repo, "try", "-m", "append to val.bin", "--json"))
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "40s"))
        got = {v["id"]: v for v in waited["finished"]}
        assert got["v0001"]["status"] == "keep", got  # the baseline ran first, untouched
        assert got[tamper["id"]]["status"] == "crash", got
        assert "data/val.bin" in got[tamper["id"]]["reason"], got
    finally:
        stop(gpuswarm, repo)
