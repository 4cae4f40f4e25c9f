"""End-to-end tests of ``gpuswarm research``: the real CLI in subprocesses, on simulated GPUs.

Each test gets its own git repository (``research_repo``: train.py whose constants LR, DEPTH,
SLEEP and CRASH decide what it prints, prepare.py protected, README.md) and drives the commands
that replace the seed's manual workflow (001: branch autoresearch/<tag>, fan out variants of
train.py from BASE, results.tsv in its exact five-column format, keep the best of a round). The
tests judge the product by what it leaves behind: git refs, the user's files and index,
results.tsv, the ledger, and the ``--json`` output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, wait_for
from integration_support import (
    edit_constant,
    git,
    make_research_repo,
    research_results,
    run_processes,
    wait_no_run_processes,
)

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]

HEADER = ["commit", "val_bpb", "memory_gb", "status", "description"]
ROW_RE = re.compile(r"^[0-9a-f]{7}\t\d+\.\d{6}\t\d+\.\d\t(keep|discard|crash)\t\S.*$")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BASE_LR, BASE_DEPTH = 0.04, 8  # TRAIN_PY's defaults


# -- what TRAIN_PY prints ----------------------------------------------------------------------
def val_bpb(lr: float = BASE_LR, depth: int = BASE_DEPTH) -> float:
    """TRAIN_PY's metric, as printed (6 decimals)."""
    return float(f"{0.9 + (lr - 0.05) ** 2 * 100 + abs(depth - 6) * 0.01:.6f}")


def memory_gb(depth: int = BASE_DEPTH) -> str:
    """The seed's memory column: peak_vram_mb / 1024, .1f."""
    peak_mb = float(f"{45060.2 + depth * 10:.1f}")
    return f"{round(peak_mb / 1024, 1):.1f}"


# -- driving the CLI ---------------------------------------------------------------------------
def init(gpuswarm: Cli, repo: Path, tag: str, *extra: str, timeout: str = "5s") -> CliResult:
    return gpuswarm(
        "research",
        "init",
        "-C",
        repo,
        "--tag",
        tag,
        "--edit",
        "train.py",
        "--protect",
        "prepare.py",
        "--command",
        "python train.py",
        "--gpus",
        "sim:4",
        "--timeout",
        timeout,
        "--linger",
        "2s",
        # one baseline run, as the seed's first round: these tests pin its rows (the default
        # repeats it for a noise estimate: tests/integration/test_research_rules.py)
        "--baseline-repeats",
        "1",
        *extra,
    )


def research(gpuswarm: Cli, repo: Path, cmd: str, *args: str | Path) -> CliResult:
    return gpuswarm("research", cmd, "-C", repo, *args)


def ok_json(result: CliResult) -> Any:
    assert result.returncode == 0, str(result)
    return json.loads(result.stdout)


def start(gpuswarm: Cli, repo: Path, tag: str, *extra: str, timeout: str = "5s") -> None:
    ok_json(init(gpuswarm, repo, tag, "--json", *extra, timeout=timeout))


def try_variant(gpuswarm: Cli, repo: Path, message: str, *args: str | Path) -> dict[str, Any]:
    data: dict[str, Any] = ok_json(research(gpuswarm, repo, "try", "-m", message, "--json", *args))
    return data


def stop(gpuswarm: Cli, repo: Path) -> None:
    assert research(gpuswarm, repo, "stop").returncode == 0


def exp_dir(repo: Path, tag: str) -> Path:
    return repo / ".gpuswarm" / "research" / tag


def ledger(repo: Path, tag: str) -> list[dict[str, Any]]:
    lines = (exp_dir(repo, tag) / "ledger.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def variant_events(repo: Path, tag: str) -> list[dict[str, Any]]:
    return [e for e in ledger(repo, tag) if e["ev"] == "variant"]


def branches(repo: Path) -> list[str]:
    return git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/").splitlines()


def show(repo: Path, rev: str, path: str) -> bytes:
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True, check=True
    ).stdout


def queue_run(repo: Path, tag: str) -> Path:
    cfg = json.loads((exp_dir(repo, tag) / "experiment.json").read_text())
    return exp_dir(repo, tag) / str(cfg["run"])


# -- 1. init -----------------------------------------------------------------------------------
def test_init_creates_branch_and_empty_results(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    head = git(repo, "rev-parse", "HEAD")
    data = ok_json(init(gpuswarm, repo, "mar5", "--json"))

    assert data["branch"] == "autoresearch/mar5"
    assert data["base"] == head
    assert git(repo, "rev-parse", "refs/heads/autoresearch/mar5") == head
    assert git(repo, "symbolic-ref", "HEAD") == "refs/heads/autoresearch/mar5"
    assert git(repo, "rev-parse", "HEAD") == head
    root = exp_dir(repo, "mar5")
    assert (root / "results.tsv").read_bytes() == b"\t".join(h.encode() for h in HEADER) + b"\n"
    assert (root / "experiment.json").is_file()
    assert (root / "ledger.jsonl").is_file()
    assert list((root / "queue").glob("run_*"))
    assert git(repo, "status", "--porcelain") == ""
    exclude = Path(git(repo, "rev-parse", "--git-path", "info/exclude"))
    exclude = exclude if exclude.is_absolute() else repo / exclude
    assert "/.gpuswarm/" in exclude.read_text().splitlines()


@pytest.mark.parametrize(
    ("case", "tag", "extra", "needles"),
    [
        ("branch exists", "taken", [], ["autoresearch/taken", "already exists"]),
        ("edit not committed", "t", ["--edit", "new.py"], ["new.py", "commit"]),
        ("bad gpus", "t", ["--gpus", "bogus"], ["--gpus", "bogus"]),
        ("bad tag", "../x", [], ["--tag", "../x"]),
        (
            "edit and protect",
            "t",
            ["--protect", "train.py"],
            ["train.py", "editable and protected"],
        ),
        # a runner could never use these (issue 12): refused here, not at its every start
        ("timeout 30d", "t", ["--timeout", "30d"], ["--timeout", "days"]),
        ("unbalanced quotes", "t", ["--command", "python3 'x"], ["--command", "quotes"]),
        ("bad shell", "t", ["--shell", "--command", "python3 'x"], ["--command", "shell"]),
        ("bad metric regex", "t", ["--metric-regex", "val: (["], ["--metric-regex"]),
        ("metric regex no group", "t", ["--metric-regex", "val: 1"], ["--metric-regex", "group"]),
        ("bad memory regex", "t", ["--memory-regex", "*mb"], ["--memory-regex"]),
    ],
)
def test_init_refusals_write_nothing(
    gpuswarm: Cli,
    research_repo: Path,
    case: str,
    tag: str,
    extra: list[str],
    needles: list[str],
) -> None:
    repo = research_repo
    if case == "branch exists":
        git(repo, "branch", "autoresearch/taken")
    if case == "edit not committed":
        (repo / "new.py").write_text("x = 1\n")
    before_branches = branches(repo)
    before_head = (git(repo, "symbolic-ref", "HEAD"), git(repo, "rev-parse", "HEAD"))

    args = ["research", "init", "-C", str(repo), "--tag", tag, "--edit", "train.py"]
    args += ["--protect", "prepare.py", "--command", "python train.py", "--gpus", "sim:4"]
    args += ["--timeout", "5s", "--linger", "2s", *extra]  # later options win (--gpus)
    result = gpuswarm(*args)

    assert result.returncode == 2, str(result)
    assert "error" in result.stderr, str(result)
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result}"
    research_dir = repo / ".gpuswarm" / "research"
    leftovers = list(research_dir.iterdir()) if research_dir.exists() else []
    assert leftovers == [], leftovers
    assert branches(repo) == before_branches
    assert (git(repo, "symbolic-ref", "HEAD"), git(repo, "rev-parse", "HEAD")) == before_head
    assert git(repo, "for-each-ref", "refs/gpuswarm/") == ""


# -- 2. a full round ---------------------------------------------------------------------------
def test_full_round_in_the_seeds_format(gpuswarm: Cli, research_repo: Path) -> None:
    repo, tag = research_repo, "r1"
    start(gpuswarm, repo, tag)
    base = git(repo, "rev-parse", "HEAD")
    base_train = (repo / "train.py").read_bytes()

    # The slow one goes first: it holds the round open (until its 5 s timeout) while the others
    # are queued, as 5-minute training runs do in the seed's workflow.
    ideas = [
        ("SLEEP", "30", "sleep past the timeout"),
        ("LR", "0.05", "increase LR to 0.05"),
        ("DEPTH", "6", "decrease depth to 6"),
        ("CRASH", "1", "crash on purpose"),
    ]
    tried: dict[str, dict[str, Any]] = {}
    for name, value, message in ideas:
        edit_constant(repo, name, value)
        data = try_variant(gpuswarm, repo, message)
        assert data["parent"] == base
        assert data["round"] == 1, data
        assert (repo / "train.py").read_bytes() == base_train  # restored to BASE
        tried[name] = data
    assert tried["SLEEP"]["baseline_queued"] == ["v0001"]
    assert all(not tried[n]["baseline_queued"] for n in ("LR", "DEPTH", "CRASH"))

    waited = ok_json(gpuswarm("research", "wait", "-C", repo, "--json", timeout=45))
    assert waited["timed_out"] is False and waited["waiting"] == []
    finished = {v["id"]: v for v in waited["finished"]}
    assert set(finished) == {"v0001", *(d["id"] for d in tried.values())}
    # reported once: a second wait has nothing new
    again = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "5s"))
    assert again["finished"] == []

    lr_val, depth_val = val_bpb(lr=0.05), val_bpb(depth=6)
    base_val = val_bpb()
    assert min(lr_val, depth_val) < base_val
    winner = "LR" if lr_val < depth_val else "DEPTH"
    winner_commit = tried[winner]["commit"]

    rows = research_results(repo, tag)
    lines = (exp_dir(repo, tag) / "results.tsv").read_text().splitlines()
    assert rows[0] == HEADER
    assert len(rows) == 6, rows
    for line in lines[1:]:
        assert ROW_RE.match(line), line
    # baseline first, then the variants in experiment order (as the seed's file; issue 29.5),
    # whatever order they were decided in
    decided = [e for e in ledger(repo, tag) if e["ev"] == "decided"]
    assert [e["row"] for e in sorted(decided, key=lambda e: e["id"])] == rows[1:]
    assert decided[0]["id"] == "v0001"
    assert rows[1] == [base[:7], f"{base_val:.6f}", memory_gb(), "keep", "baseline"]

    by_commit = {r[0]: r for r in rows[1:]}
    assert len(by_commit) == 5
    crash_rows = [r for r in rows[1:] if r[3] == "crash"]
    assert len(crash_rows) == 2, rows
    for r in crash_rows:
        assert r[1:4] == ["0.000000", "0.0", "crash"]
    crash = by_commit[tried["CRASH"]["commit"][:7]]
    assert crash[3] == "crash"
    assert re.search(r"\(.*(exit|code).*1.*\)$", crash[4]), crash
    slow = by_commit[tried["SLEEP"]["commit"][:7]]
    assert slow[3] == "crash"
    assert re.search(r"\(.*timeout.*\)$", slow[4]), slow

    lr_row = by_commit[tried["LR"]["commit"][:7]]
    depth_row = by_commit[tried["DEPTH"]["commit"][:7]]
    assert lr_row[1:3] == [f"{lr_val:.6f}", memory_gb()]
    assert depth_row[1:3] == [f"{depth_val:.6f}", memory_gb(6)]
    assert (lr_row[3], depth_row[3]) == (
        ("keep", "discard") if winner == "LR" else ("discard", "keep")
    )
    for name, _, message in ideas:
        desc = by_commit[tried[name]["commit"][:7]][4]
        assert re.match(r"^\[R1 gpu[0-3]\] ", desc), desc
        assert message in desc
    assert [v["status"] for v in finished.values()].count("keep") == 2  # baseline + winner

    assert git(repo, "rev-parse", f"autoresearch/{tag}") == winner_commit
    status = ok_json(research(gpuswarm, repo, "status", "--json"))
    assert status["base"] == winner_commit
    assert status["best"] == pytest.approx(min(lr_val, depth_val))
    assert status["in_flight"] == []
    assert (repo / "train.py").read_bytes() == show(repo, winner_commit, "train.py")
    assert git(repo, "status", "--porcelain") == ""
    stop(gpuswarm, repo)


# -- 3. the user's git state -------------------------------------------------------------------
def test_try_leaves_index_head_and_branch_alone(gpuswarm: Cli, research_repo: Path) -> None:
    repo, tag = research_repo, "idx"
    start(gpuswarm, repo, tag)
    base = git(repo, "rev-parse", "HEAD")
    index = repo / ".git" / "index"
    index_bytes = index.read_bytes()
    head_ref = git(repo, "symbolic-ref", "HEAD")
    refs_before = branches(repo)

    edit_constant(repo, "DEPTH", "20")  # worse than BASE: discarded, the branch stays
    lock = repo / ".git" / "index.lock"
    lock.write_bytes(b"")  # a stale lock, as a crashed git would leave
    try:
        data = try_variant(gpuswarm, repo, "deeper")
        assert index.read_bytes() == index_bytes
        assert git(repo, "symbolic-ref", "HEAD") == head_ref
        assert git(repo, "rev-parse", "HEAD") == base
        assert branches(repo) == refs_before
        assert git(repo, "rev-parse", f"autoresearch/{tag}") == base
        assert lock.exists() and lock.read_bytes() == b""
    finally:
        lock.unlink(missing_ok=True)
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "train.py").read_bytes() == show(repo, base, "train.py")

    commit = data["commit"]
    assert git(repo, "rev-list", "--parents", "-n", "1", commit).split() == [commit, base]
    assert git(repo, "diff", "--name-only", base, commit).splitlines() == ["train.py"]
    assert b"DEPTH = 20\n" in show(repo, commit, "train.py")
    assert git(repo, "log", "-1", "--format=%s", commit) == "deeper"

    waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "20s"))
    assert waited["timed_out"] is False
    assert git(repo, "rev-parse", f"autoresearch/{tag}") == base
    assert git(repo, "status", "--porcelain") == ""
    stop(gpuswarm, repo)


# -- 4. try refusals ---------------------------------------------------------------------------
def test_try_refusals_queue_nothing(gpuswarm: Cli, research_repo: Path) -> None:
    repo, tag = research_repo, "no"
    start(gpuswarm, repo, tag)
    train = (repo / "train.py").read_bytes()

    def refused(*args: str, needles: tuple[str, ...] = ()) -> CliResult:
        result = research(gpuswarm, repo, "try", *args)
        assert result.returncode == 2, str(result)
        assert "error" in result.stderr, str(result)
        for needle in needles:
            assert needle in result.stderr, f"{needle!r} not in:\n{result}"
        assert variant_events(repo, tag) == []
        assert git(repo, "for-each-ref", f"refs/gpuswarm/{tag}/") == ""
        return result

    refused("-m", "nothing changed", needles=("no change", "train.py"))

    edit_constant(repo, "LR", "0.05")
    with (repo / "prepare.py").open("a") as fh:
        fh.write("SEQ_LEN = 4096\n")
    refused("-m", "touches prepare", needles=("prepare.py", "protected"))
    git(repo, "checkout", "--", "prepare.py")

    (repo / "README.md").write_text("# changed\n")
    refused("-m", "touches readme", needles=("README.md",))
    git(repo, "checkout", "--", "README.md")

    refused("-m", "", needles=("-m",))
    refused("-m", "   ", needles=("-m",))

    # refusals leave the user's edit alone
    assert (repo / "train.py").read_bytes() != train
    assert b"LR = 0.05\n" in (repo / "train.py").read_bytes()
    assert not list((queue_run(repo, tag) / ".parallel" / "pending").iterdir())
    stop(gpuswarm, repo)


# -- 5. --patch --------------------------------------------------------------------------------
def test_try_patch(gpuswarm: Cli, research_repo: Path, tmp_path: Path) -> None:
    repo, tag = research_repo, "patch"
    start(gpuswarm, repo, tag)
    base = git(repo, "rev-parse", "HEAD")

    edit_constant(repo, "LR", "0.05")
    patch = tmp_path / "lr.diff"
    patch.write_text(git(repo, "diff", "--", "train.py") + "\n")
    (repo / "README.md").write_text("# changed\n")
    readme_patch = tmp_path / "readme.diff"
    readme_patch.write_text(git(repo, "diff", "--", "README.md") + "\n")
    git(repo, "checkout", "--", "train.py", "README.md")
    assert git(repo, "status", "--porcelain") == ""

    result = research(gpuswarm, repo, "try", "-m", "readme", "--patch", readme_patch)
    assert result.returncode == 2, str(result)
    assert "README.md" in result.stderr, str(result)
    assert variant_events(repo, tag) == []

    data = try_variant(gpuswarm, repo, "lr from a patch", "--patch", patch)
    assert data["parent"] == base
    assert b"LR = 0.05\n" in show(repo, data["commit"], "train.py")
    assert git(repo, "diff", "--name-only", base, data["commit"]).splitlines() == ["train.py"]
    assert git(repo, "status", "--porcelain") == ""  # the user's files were never touched

    waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "20s"))
    assert waited["timed_out"] is False
    got = {v["id"]: v for v in waited["finished"]}[data["id"]]
    assert got["metric"] == pytest.approx(val_bpb(lr=0.05))
    assert got["status"] == "keep"
    assert git(repo, "rev-parse", f"autoresearch/{tag}") == data["commit"]
    stop(gpuswarm, repo)


# -- 6. manual policy --------------------------------------------------------------------------
def test_manual_policy_keep_and_discard(gpuswarm: Cli, research_repo: Path) -> None:
    repo, tag = research_repo, "man"
    start(gpuswarm, repo, tag, "--policy", "manual")
    base = git(repo, "rev-parse", "HEAD")

    edit_constant(repo, "LR", "0.05")
    lr = try_variant(gpuswarm, repo, "lr 0.05")
    edit_constant(repo, "DEPTH", "6")
    depth = try_variant(gpuswarm, repo, "depth 6")
    edit_constant(repo, "CRASH", "1")
    crash = try_variant(gpuswarm, repo, "crash")
    waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "25s"))
    assert waited["timed_out"] is False

    status = ok_json(research(gpuswarm, repo, "status", "--json"))
    undecided = {v["id"] for v in status["undecided"]}
    assert undecided == {lr["id"], depth["id"]}
    assert git(repo, "rev-parse", f"autoresearch/{tag}") == base  # nothing decided by itself
    rows = research_results(repo, tag)
    assert [r[3] for r in rows[1:]] == ["keep", "crash"]  # baseline, then the crash

    kept = ok_json(research(gpuswarm, repo, "keep", lr["id"], "--json"))
    assert kept["status"] == "keep"
    assert git(repo, "rev-parse", f"autoresearch/{tag}") == lr["commit"]
    assert git(repo, "rev-parse", "HEAD") == lr["commit"]
    assert (repo / "train.py").read_bytes() == show(repo, lr["commit"], "train.py")
    assert git(repo, "status", "--porcelain") == ""

    dropped = ok_json(research(gpuswarm, repo, "discard", depth["id"], "--json"))
    assert dropped["status"] == "discard"
    rows = research_results(repo, tag)  # experiment order: baseline, lr, depth, crash
    assert [r[3] for r in rows[1:]] == ["keep", "keep", "discard", "crash"]
    assert rows[-3][:4] == [lr["commit"][:7], f"{val_bpb(lr=0.05):.6f}", memory_gb(), "keep"]
    assert rows[-2][:4] == [depth["commit"][:7], f"{val_bpb(depth=6):.6f}", memory_gb(6), "discard"]
    assert git(repo, "rev-parse", f"autoresearch/{tag}") == lr["commit"]

    refused = research(gpuswarm, repo, "keep", crash["id"])
    assert refused.returncode == 2, str(refused)
    assert "crash" in refused.stderr, str(refused)
    assert git(repo, "rev-parse", f"autoresearch/{tag}") == lr["commit"]
    status = ok_json(research(gpuswarm, repo, "status", "--json"))
    assert status["undecided"] == []
    stop(gpuswarm, repo)


# -- 7. a variant that changes a protected file at run time ------------------------------------
def test_variant_writing_protected_file_is_a_crash(gpuswarm: Cli, research_repo: Path) -> None:
    repo, tag = research_repo, "prot"
    start(gpuswarm, repo, tag)
    with (repo / "train.py").open("a") as fh:
        fh.write('with open("prepare.py", "a") as fh:\n    fh.write("SEQ_LEN = 1\\n")\n')
    data = try_variant(gpuswarm, repo, "tamper with the evaluation")
    waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "20s"))
    assert waited["timed_out"] is False

    rows = research_results(repo, tag)
    (row,) = [r for r in rows[1:] if r[0] == data["commit"][:7]]
    assert row[1:4] == ["0.000000", "0.0", "crash"]
    assert "prepare.py" in row[4] and row[4].endswith(")"), row
    assert git(repo, "rev-parse", f"autoresearch/{tag}") == git(repo, "rev-parse", "master")
    assert (repo / "prepare.py").read_text() == show(repo, "master", "prepare.py").decode()
    stop(gpuswarm, repo)


# -- 8. log, plot, status ----------------------------------------------------------------------
def test_log_plot_and_status(gpuswarm: Cli, research_repo: Path) -> None:
    repo, tag = research_repo, "look"
    start(gpuswarm, repo, tag)
    # the worse one first: whether or not it is decided before the next try, BASE stays put
    edit_constant(repo, "DEPTH", "20")
    try_variant(gpuswarm, repo, "depth 20")
    edit_constant(repo, "LR", "0.05")
    try_variant(gpuswarm, repo, "lr 0.05")
    assert research(gpuswarm, repo, "wait", "--timeout", "20s").returncode == 0

    results = exp_dir(repo, tag) / "results.tsv"
    logged = research(gpuswarm, repo, "log")
    assert logged.returncode == 0, str(logged)
    assert logged.stdout == results.read_text()
    assert len(research_results(repo, tag)) == 4

    plotted = ok_json(research(gpuswarm, repo, "plot", "--json"))
    png = exp_dir(repo, tag) / "progress.png"
    assert Path(plotted["plot"]).resolve() == png.resolve()
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert png.stat().st_size > 1000

    status = ok_json(research(gpuswarm, repo, "status", "--json"))
    for key in ("base", "best", "in_flight", "last"):
        assert key in status, key
    assert status["best"] == pytest.approx(val_bpb(lr=0.05))
    assert status["in_flight"] == []
    assert [r["status"] for r in status["last"]] == ["keep", "discard", "keep"]
    assert git(repo, "status", "--porcelain") == ""
    stop(gpuswarm, repo)


# -- 9. stop and resume ------------------------------------------------------------------------
def test_stop_requeues_and_wait_restarts_the_runner(gpuswarm: Cli, research_repo: Path) -> None:
    repo, tag = research_repo, "halt"
    start(gpuswarm, repo, tag, timeout="60s")
    edit_constant(repo, "SLEEP", "30")
    slow = try_variant(gpuswarm, repo, "slow")
    vid = slow["id"]

    assert slow["baseline_queued"] == ["v0001"]
    waited = ok_json(research(gpuswarm, repo, "wait", "v0001", "--json", "--timeout", "20s"))
    assert [v["status"] for v in waited["finished"]] == ["keep"]
    run_dir = queue_run(repo, tag)

    def running() -> bool:  # claimed by the runner, and a task process alive
        leases = [n for n in os.listdir(run_dir / ".parallel" / "running") if n[:1] != "."]
        claimed = any(vid in n for n in leases)
        return claimed and bool(run_processes(run_dir))

    wait_for(running, timeout=20, interval=0.1, what=f"{vid} running")
    (flight,) = ok_json(research(gpuswarm, repo, "status", "--json"))["in_flight"]
    assert (flight["id"], flight["status"]) == (vid, "running")
    assert flight["slot"] is not None

    stopped = ok_json(research(gpuswarm, repo, "stop", "--json"))
    assert stopped["stopped"] == 1
    wait_no_run_processes(run_dir, timeout=10)
    assert run_processes(exp_dir(repo, tag), var="GPUSWARM_EXPERIMENT") == []

    status = ok_json(research(gpuswarm, repo, "status", "--json"))
    assert status["runner"] is False
    (flight,) = status["in_flight"]
    assert (flight["id"], flight["status"]) == (vid, "queued")
    rows = research_results(repo, tag)
    assert [r[3] for r in rows[1:]] == ["keep"]  # the baseline; no crash row for the slow one
    assert not [e for e in ledger(repo, tag) if e["ev"] == "finished" and e["id"] == vid]

    result = research(gpuswarm, repo, "wait", "--timeout", "1s")
    assert result.returncode == 1, str(result)
    assert vid in result.stdout
    wait_for(running, timeout=20, interval=0.2, what=f"{vid} running again")
    assert ok_json(research(gpuswarm, repo, "status", "--json"))["runner"] is True

    assert ok_json(research(gpuswarm, repo, "stop", "--json"))["stopped"] == 1
    wait_no_run_processes(run_dir, timeout=10)
    assert [r[3] for r in research_results(repo, tag)[1:]] == ["keep"]


def test_report_is_self_contained_and_lists_every_experiment(
    gpuswarm: Any, research_repo: Path
) -> None:
    repo = research_repo
    init = gpuswarm(
        "research",
        "init",
        "-C",
        repo,
        "--tag",
        "rep",
        "--edit",
        "train.py",
        "--protect",
        "prepare.py",
        "--command",
        "python train.py",
        "--gpus",
        "sim:4",
        "--linger",
        "2s",
    )
    assert init.returncode == 0, str(init)
    edit_constant(repo, "DEPTH", "6")
    assert gpuswarm("research", "try", "-C", repo, "-m", "depth <b>6</b>").returncode == 0
    assert gpuswarm("research", "wait", "-C", repo).returncode == 0
    out = gpuswarm("research", "report", "-C", repo, "--json")
    assert out.returncode == 0, str(out)
    files = json.loads(out.stdout)
    html = Path(files["report"]).read_text()
    assert "data:image/png;base64," in html  # progress.png inside the page
    assert "http://" not in html and "https://" not in html
    assert "depth &lt;b&gt;6&lt;/b&gt;" in html and "<b>6</b>" not in html
    # the default (noise-aware) runs the first baseline twice: two baseline rows, the keep
    assert html.count('<tr class="keep">') == 3
    assert "noise: sd 0.000000 (2 runs of 1 commit)" in html  # the noise estimate
    assert Path(files["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    gpuswarm("research", "stop", "-C", repo)


# -- issue 29, item 6: research mutate --list ---------------------------------------------------
def test_mutate_list_shows_knobs_and_why_others_are_skipped(
    gpuswarm: Cli, tmp_path: Path, run_reaper: None
) -> None:
    nanogpt = Path(__file__).parents[1] / "data" / "research" / "nanogpt_train.py"
    repo = make_research_repo(tmp_path / "nano", train_py=nanogpt.read_text())
    ok_json(init(gpuswarm, repo, "knobs", "--json"))
    data = ok_json(research(gpuswarm, repo, "mutate", "--list", "--json"))
    rows = {r["name"]: r for r in data["settings"]}
    for name in (
        "iter_num",
        "running_mfu",
        "best_val_loss",
        "training_time",
        "log_interval",
        "eval_iters",
        "time_budget",
    ):
        assert not rows[name]["knob"] and rows[name]["why"], rows[name]
    assert rows["beta2"]["knob"] and all(0 < float(v) < 1 for v in rows["beta2"]["tries"])
    assert rows["learning_rate"]["knob"] and rows["learning_rate"]["line"] > 0
    text = research(gpuswarm, repo, "mutate", "--list")
    assert text.returncode == 0, str(text)
    assert "knob  learning_rate" in text.stdout
    assert "skip  iter_num" in text.stdout and "state: assigned again in a loop" in text.stdout
    only = ok_json(research(gpuswarm, repo, "mutate", "--list", "--mutate", "n_*", "--json"))
    assert {r["name"] for r in only["settings"] if r["knob"]} == {"n_layer", "n_head", "n_embd"}


def test_a_kept_improvement_is_notified(gpuswarm: Cli, research_repo: Path) -> None:
    """Issue 37: ``research init --notify URL``: the runner's notifier posts ``kept`` when a
    change is kept (a baseline's keep is none)."""
    from hookkit import Receiver

    hook = Receiver()
    try:
        repo, tag = research_repo, "hook"
        start(gpuswarm, repo, tag, "--policy", "manual", "--notify", hook.url)
        edit_constant(repo, "LR", "0.05")
        lr = try_variant(gpuswarm, repo, "lr 0.05")
        waited = ok_json(research(gpuswarm, repo, "wait", "--json", "--timeout", "25s"))
        assert waited["timed_out"] is False
        assert ok_json(research(gpuswarm, repo, "keep", lr["id"], "--json"))["status"] == "keep"
        got = wait_for(lambda: [e for e in hook.events() if e["event"] == "kept"], 20)
        assert got[0]["variant"] == lr["id"] and got[0]["experiment"] == tag, got
        assert got[0]["metric"] == pytest.approx(val_bpb(lr=0.05), abs=1e-6)
        assert all(e["event"] != "run_finished" for e in hook.events())
    finally:
        hook.close()
