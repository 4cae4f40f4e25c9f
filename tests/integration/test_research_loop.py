"""The autonomous research loop and its crash recovery, with the real CLI in subprocesses.

Each scenario gets its own git repository (``research_repo``: a tiny CPU ``train.py`` whose
UPPER_CASE constants decide what it prints) and an experiment on simulated GPUs. The loop is
judged by what it leaves behind: ``results.tsv`` in the seed's format, the experiment's journal
(``ledger.jsonl``), the branch ``autoresearch/<tag>``, the core run under ``queue/`` and the
variant exports under ``variants/`` (removed once a variant is recorded).

The unit tests of the decision policies (``research.policy.decide``) on hand-built states are
in ``tests/research/test_policy.py`` (fast: no subprocess).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_driver import CliProcess, CliResult, pid_running, wait_for
from integration_support import (
    TRAIN_PY,
    descriptor,
    edit_constant,
    git,
    research_ledger,
    research_results,
    run_processes,
    wait_no_run_processes,
)

pytestmark = pytest.mark.slow

PY = sys.executable
Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]

TAG = "t"
BRANCH = f"autoresearch/{TAG}"
HEADER = ["commit", "val_bpb", "memory_gb", "status", "description"]
ROW_RE = re.compile(r"^[0-9a-f]{7}\t\d+\.\d{6}\t\d+\.\d\t(keep|discard|crash)\t\S.*$")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- helpers -----------------------------------------------------------------------------------
def exp_dir(repo: Path) -> Path:
    return repo / ".gpuswarm" / "research" / TAG


def core_run(repo: Path) -> Path:
    (run,) = sorted((exp_dir(repo) / "queue").glob("run_*"))
    return run


def ledger(repo: Path) -> list[dict[str, Any]]:
    return research_ledger(repo, TAG)


def events(repo: Path, ev: str) -> list[dict[str, Any]]:
    return [e for e in ledger(repo) if e.get("ev") == ev]


def variant_events(repo: Path) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in events(repo, "variant")}


def decided_events(repo: Path) -> dict[str, dict[str, Any]]:
    """variant id -> its one ``decided`` event (asserts there is no second one)."""
    out: dict[str, dict[str, Any]] = {}
    for e in events(repo, "decided"):
        assert e["id"] not in out, f"{e['id']} decided twice: {out[e['id']]} and {e}"
        out[e["id"]] = e
    return out


def rows(repo: Path) -> list[list[str]]:
    """results.tsv rows without the header (which is checked)."""
    table = research_results(repo, TAG)
    assert table[0] == HEADER, table[0]
    return table[1:]


def tsv_lines(repo: Path) -> list[str]:
    return (exp_dir(repo) / "results.tsv").read_text().splitlines()


def export_dirs(repo: Path) -> list[str]:
    root = exp_dir(repo) / "variants"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def branch_tip(repo: Path) -> str:
    return git(repo, "rev-parse", f"refs/heads/{BRANCH}")


def commit_all(repo: Path, message: str) -> None:
    git(repo, "commit", "-q", "-am", message)


def init(
    gpuswarm: Cli, repo: Path, *extra: str, gpus: str = "sim:4", mode: str | None = None
) -> CliResult:
    args = [
        "research",
        "init",
        "-C",
        repo,
        "--tag",
        TAG,
        "--edit",
        "train.py",
        "--protect",
        "prepare.py",
        "--command",
        f"{shlex.quote(PY)} train.py",
        "--gpus",
        gpus,
        "--timeout",
        "10s",
        "--linger",
        "2s",
        "--baseline-repeats",  # one baseline run, as the seed's first round (pinned rows)
        "1",
        *(["--mode", mode] if mode else []),
        *extra,
    ]
    res = gpuswarm(*args)
    assert res.returncode == 0, res
    return res


def stop(gpuswarm: Cli, repo: Path) -> None:
    res = gpuswarm("research", "stop", "-C", repo)
    assert res.returncode == 0, res


def runner_procs(repo: Path) -> list[psutil.Process]:
    """The experiment's background runner(s): GPUSWARM_EXPERIMENT=<exp dir>, ``_serve``."""
    out = []
    for proc in run_processes(exp_dir(repo), var="GPUSWARM_EXPERIMENT"):
        try:
            if "_serve" in proc.cmdline():
                out.append(proc)
        except psutil.Error:
            continue
    return out


def running_tasks(repo: Path) -> list[str]:
    folder = core_run(repo) / ".parallel" / "running"
    return sorted(n for n in _listdir(folder) if not n.startswith("."))


def _listdir(folder: Path) -> list[str]:
    try:
        return [p.name for p in folder.iterdir()]
    except FileNotFoundError:
        return []


def expected_metric(lr: float, depth: int) -> float:
    """What TRAIN_PY prints as val_bpb."""
    return 0.9 + (lr - 0.05) ** 2 * 100 + abs(depth - 6) * 0.01


def assert_nothing_lost(repo: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every journaled variant has exactly one ``decided`` event and exactly one results.tsv row
    (the row the event carries); results.tsv is in the seed's format; no export is left."""
    variants = variant_events(repo)
    decided = decided_events(repo)
    assert set(decided) == set(variants), (
        f"undecided: {sorted(set(variants) - set(decided))}, "
        f"decided but unknown: {sorted(set(decided) - set(variants))}"
    )
    table = rows(repo)
    assert len(table) == len(decided), (table, sorted(decided))
    assert sorted(map(tuple, table)) == sorted(tuple(e["row"]) for e in decided.values())
    for line in tsv_lines(repo)[1:]:
        assert ROW_RE.match(line), repr(line)
    assert export_dirs(repo) == []
    return variants, decided


def assert_no_processes(repo: Path) -> None:
    wait_no_run_processes(core_run(repo), timeout=15)
    wait_for(lambda: not runner_procs(repo), 15, what="the runner to be gone")


def status_json(gpuswarm: Cli, repo: Path) -> dict[str, Any]:
    res = gpuswarm("research", "status", "-C", repo, "--json")
    assert res.returncode == 0, res
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def wait_all(gpuswarm: Cli, repo: Path, tries: int = 4) -> dict[str, Any]:
    """``research wait`` until no variant is in flight (a settle may queue a combination)."""
    for _ in range(tries):
        res = gpuswarm("research", "wait", "-C", repo, "--timeout", "30s", timeout=60)
        assert res.returncode == 0, res
        data = status_json(gpuswarm, repo)
        if not data["in_flight"]:
            return data
    raise AssertionError(f"variants still in flight after {tries} waits: {data['in_flight']}")


def try_edit(gpuswarm: Cli, repo: Path, message: str, **constants: str) -> str:
    for name, value in constants.items():
        edit_constant(repo, name, value)
    res = gpuswarm("research", "try", "-C", repo, "-m", message, "--json")
    assert res.returncode == 0, res
    vid: str = json.loads(res.stdout)["id"]
    return vid


# -- 1. async loop with the mutate proposer ----------------------------------------------------
@pytest.mark.timeout(90)
def test_loop_async_mutate_records_every_variant(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    init(gpuswarm, repo, mode="async")
    res = gpuswarm(
        "research",
        "loop",
        "-C",
        repo,
        "--proposer",
        "mutate",
        "--mode",
        "async",
        "--max-experiments",
        "12",
        "--seed",
        "1",
        "--controls",  # the rows this test pins are the variants' (controls: test_research_drift)
        "off",
        timeout=80,
    )
    try:
        assert res.returncode == 0, res
        variants, decided = assert_nothing_lost(repo)
        kinds = [v["kind"] for v in variants.values()]
        # re-based winners (combos) count against the budget like any variant
        assert kinds.count("baseline") == 1, kinds
        assert 12 <= kinds.count("variant") + kinds.count("combo") <= 12 + 4, kinds
        table = rows(repo)
        assert len(table) == len(kinds), table
        # (a crash may be recorded before the baseline: it needs no reference)
        assert [r[3] for r in table if r[4] == "baseline"] == ["keep"], table
        # one line per decision on stdout
        for vid, e in decided.items():
            assert re.search(rf"\b{vid} {e['row'][3]}\b", res.stdout), (vid, res.stdout)
        # the branch is at the last kept commit
        kept = [r for r in table if r[3] == "keep"]
        assert branch_tip(repo).startswith(kept[-1][0]), (branch_tip(repo), kept)
        last_keep = [e for e in decided.values() if e["status"] == "keep"][-1]
        assert branch_tip(repo) == variants[last_keep["id"]]["commit"]
        png = exp_dir(repo) / "progress.png"
        assert png.is_file() and png.read_bytes()[:8] == PNG_MAGIC
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)


# -- 2. rounds mode ----------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_loop_rounds_one_keep_per_round(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    # runs of >= 1 s: a round is filled before any of its members finishes (see
    # test_loop_rounds_slow_proposer_fills_the_round for what happens otherwise)
    edit_constant(repo, "SLEEP", "2.0")
    commit_all(repo, "slower runs")
    init(gpuswarm, repo, mode="rounds")
    res = gpuswarm(
        "research",
        "loop",
        "-C",
        repo,
        "--mode",
        "rounds",
        "--max-experiments",
        "8",
        "--seed",
        "3",
        "--controls",  # rounds of 4 variants (a control takes one of the 4: test_research_drift)
        "off",
        timeout=80,
    )
    try:
        assert res.returncode == 0, res
        variants, decided = assert_nothing_lost(repo)
        table = rows(repo)
        r1 = [r for r in table if r[4].startswith("[R1 gpu")]
        r2 = [r for r in table if r[4].startswith("[R2 gpu")]
        assert len(r1) == 4 and len(r2) == 4, table
        for members in (r1, r2):
            assert sum(r[3] == "keep" for r in members) <= 1, members
        # round 2 fans out from the BASE round 1 left behind
        by_round: dict[int, list[dict[str, Any]]] = {}
        for v in variants.values():
            if v["kind"] == "variant":
                by_round.setdefault(v["round"], []).append(v)
        assert sorted(by_round) == [1, 2]
        for r in (1, 2):
            assert len({v["parent"] for v in by_round[r]}) == 1, by_round[r]
        r1_keep = [v for v in by_round[1] if decided[v["id"]]["status"] == "keep"]
        r2_parent = by_round[2][0]["parent"]
        base0 = events(repo, "init")[0]["base"]
        assert r2_parent == (r1_keep[0]["commit"] if r1_keep else base0)
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)


# -- 3. SIGKILL of the loop ----------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_loop_sigkill_then_rerun_loses_nothing(
    gpuswarm: Cli, gpuswarm_popen: Popen, research_repo: Path
) -> None:
    repo = research_repo
    edit_constant(repo, "SLEEP", "1.0")
    commit_all(repo, "slower runs")
    init(gpuswarm, repo, mode="async")
    loop = gpuswarm_popen("research", "loop", "-C", repo, "--max-experiments", "12", "--seed", "5")
    try:
        # killed with results in (decided) and variants in flight (proposed after them)
        wait_for(
            lambda: (
                (len(variant_events(repo)) >= 7 and events(repo, "decided")) or not loop.alive()
            ),
            30,
            what="a few variants in the ledger",
        )
        assert loop.alive(), loop.wait(1)
        loop.send(signal.SIGKILL)
        killed = loop.wait(10)
        assert killed.returncode == -signal.SIGKILL, killed
        before = set(variant_events(repo))
        assert before, "nothing was journaled before the kill"

        res = gpuswarm(
            "research", "loop", "-C", repo, "--max-experiments", "4", "--seed", "6", timeout=80
        )
        assert res.returncode == 0, res
        variants, _ = assert_nothing_lost(repo)
        assert before <= set(variants)
        made = [v for v in variants.values() if v["kind"] == "variant" and v["id"] not in before]
        assert len(made) == 4, made
        assert status_json(gpuswarm, repo)["in_flight"] == []
    finally:
        stop(gpuswarm, repo)
    check = gpuswarm("check", core_run(repo))
    assert check.returncode == 0, check
    assert_no_processes(repo)


# -- issue 29, item 3: one loop per experiment -----------------------------------------------------
@pytest.mark.timeout(90)
def test_a_second_loop_is_refused_naming_the_first(
    gpuswarm: Cli, gpuswarm_popen: Popen, research_repo: Path
) -> None:
    repo = research_repo
    edit_constant(repo, "SLEEP", "1.0")
    commit_all(repo, "slower runs")
    init(gpuswarm, repo, mode="rounds")
    first = gpuswarm_popen(
        "research", "loop", "-C", repo, "--mode", "rounds", "--max-experiments", "6", "--seed", "3"
    )
    try:
        wait_for(lambda: len(variant_events(repo)) >= 2 or not first.alive(), 30, what="variants")
        assert first.alive(), first.wait(1)
        ledger_before = len(events(repo, "mode"))
        second = gpuswarm("research", "loop", "-C", repo, "--max-experiments", "2", timeout=30)
        assert second.returncode == 2, second
        assert "already runs" in second.stderr and f"pid {first.pid}" in second.stderr, second
        assert "rounds mode" in second.stderr, second
        # the second changed nothing: no mode of its own, no variant
        assert len(events(repo, "mode")) == ledger_before
        done = first.wait(80)
        assert done.returncode == 0, done
        variants, _ = assert_nothing_lost(repo)
        made = [v for v in variants.values() if v["kind"] == "variant"]
        assert len(made) == 6, made
        assert all(isinstance(v.get("round"), int) for v in made), made
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)


# -- 4. SIGKILL of the background runner -------------------------------------------------------
@pytest.mark.timeout(90)
def test_runner_sigkill_reruns_variants(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    # 4 s: long enough for three `try`s to queue while the baseline still runs
    edit_constant(repo, "SLEEP", "4.0")
    commit_all(repo, "slower runs")
    init(gpuswarm, repo, mode="rounds")  # one round: all four decided together
    want = {
        try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05"): expected_metric(0.05, 8),
        try_edit(gpuswarm, repo, "DEPTH to 6", DEPTH="6"): expected_metric(0.04, 6),
        try_edit(gpuswarm, repo, "LR to 0.03", LR="0.03"): expected_metric(0.03, 8),
    }
    try:
        baseline = [v["id"] for v in variant_events(repo).values() if v["kind"] == "baseline"]
        assert len(baseline) == 1
        want[baseline[0]] = expected_metric(0.04, 8)
        wait_for(lambda: len(running_tasks(repo)) == 4, 60, what="4 variants running")
        wait_for(lambda: len(run_processes(core_run(repo))) >= 4, 20, what="the tasks' processes")
        tasks = {p.pid for p in run_processes(core_run(repo))}
        (runner,) = wait_for(lambda: len(runner_procs(repo)) == 1 and runner_procs(repo), 10)
        runner.kill()
        runner.wait(10)
        assert not events(repo, "finished")

        res = gpuswarm("research", "wait", "-C", repo, "--timeout", "60s", timeout=80)
        assert res.returncode == 0, res
        variants, decided = assert_nothing_lost(repo)
        assert set(variants) == set(want)
        finished = {e["id"]: e for e in events(repo, "finished")}
        for vid, metric in want.items():
            fin = finished[vid]
            assert fin["ok"], fin
            assert fin["metric"] == pytest.approx(metric, abs=1e-6), (vid, fin)
            assert decided[vid]["status"] in ("keep", "discard"), decided[vid]
            assert float(decided[vid]["row"][1]) == pytest.approx(metric, abs=1e-6)
            # run again: the first attempt was cut short by the kill, the last one finished
            attempts = descriptor(core_run(repo), vid)["attempts"]
            assert attempts[0].get("interrupted"), attempts
            assert attempts[-1].get("returncode") == 0 and not attempts[-1].get("interrupted")
        # the orphaned tasks of the killed runner did not survive the new runner's recovery
        assert not [pid for pid in tasks if pid_running(pid)]
        # DEPTH 6 is the best of the round: it is BASE now
        best = min(want, key=lambda k: want[k])
        assert branch_tip(repo) == variants[best]["commit"]
    finally:
        stop(gpuswarm, repo)
    check = gpuswarm("check", core_run(repo))
    assert check.returncode == 0, check
    assert_no_processes(repo)


# -- 5. async: a late winner is re-based onto BASE ---------------------------------------------
def spaced_train_py(repo: Path, sleep: str) -> None:
    """Commit a train.py with a line between its constants (edits of neighbouring constants
    would conflict in a three-way merge: git treats adjacent hunks as one) and runs that take
    ``sleep`` seconds."""
    text = TRAIN_PY
    for name in ("DEPTH", "SLEEP", "CRASH"):
        text = text.replace(f"\n{name} = ", f"\n# {name.lower()}\n{name} = ")
    (repo / "train.py").write_text(text)
    edit_constant(repo, "SLEEP", sleep)
    commit_all(repo, "one constant per paragraph")


@pytest.mark.timeout(90)
def test_async_late_winner_is_rebased_as_combo(gpuswarm: Cli, research_repo: Path) -> None:
    repo = research_repo
    spaced_train_py(repo, "1.5")  # BASE runs 1.5 s
    init(gpuswarm, repo, mode="async")
    try:
        res = gpuswarm("research", "baseline", "-C", repo)
        assert res.returncode == 0, res
        wait_all(gpuswarm, repo)
        base0 = branch_tip(repo)
        # the fast one must not finish before the slow one is made (a settle would keep it
        # first, and the slow one would be made on the new BASE): 1.5 s leaves room for a `try`
        fast = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        assert git(repo, "diff", "--stat", base0, "--", "train.py") == ""  # restored by try
        slow = try_edit(gpuswarm, repo, "DEPTH to 6", DEPTH="6", SLEEP="2.5")
        vs = variant_events(repo)
        assert vs[fast]["parent"] == vs[slow]["parent"] == base0
        wait_all(gpuswarm, repo)

        variants, decided = assert_nothing_lost(repo)
        assert decided[fast]["status"] == "keep"
        combos = [v for v in variants.values() if v["kind"] == "combo"]
        assert len(combos) == 1, combos
        combo = combos[0]
        assert combo["origin"] == slow
        assert combo["parent"] == variants[fast]["commit"]
        assert combo["description"] == f"DEPTH to 6 + BASE {variants[fast]['commit'][:7]}"
        source = git(repo, "show", f"{combo['commit']}:train.py")
        assert "\nLR = 0.05\n" in source and "\nDEPTH = 6\n" in source, source
        assert decided[slow]["status"] == "discard"
        assert "re-evaluating" in decided[slow]["reason"], decided[slow]
        assert combo["id"] in decided[slow]["reason"]
        assert decided[combo["id"]]["status"] == "keep"
        assert branch_tip(repo) == combo["commit"]
        assert float(decided[combo["id"]]["row"][1]) == pytest.approx(expected_metric(0.05, 6))
        slow_row = next(r for r in rows(repo) if r[0] == variants[slow]["commit"][:7])
        assert slow_row[3] == "discard"
        assert slow_row[4].endswith(f"(re-based, see {combo['id']})"), slow_row  # not a bug
        status = status_json(gpuswarm, repo)
        assert status["in_flight"] == []
        # issue 29, item 4: the views say re-based, and count the combination as the keep
        assert {r["id"]: r["status"] for r in status["last"]}[slow] == "re-based", status
        assert (status["kept"], status["rebased"]) == (2, 1), status
        text = gpuswarm("research", "status", "-C", repo).stdout
        assert re.search(rf"{slow}  \S+ +[\d.]+ +[\d.]+  re-based ", text), text
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)


@pytest.mark.timeout(90)
def test_async_late_winner_conflicting_with_base_is_discarded(
    gpuswarm: Cli, research_repo: Path
) -> None:
    repo = research_repo
    spaced_train_py(repo, "1.5")  # BASE runs 1.5 s
    init(gpuswarm, repo, mode="async")
    try:
        res = gpuswarm("research", "baseline", "-C", repo)
        assert res.returncode == 0, res
        wait_all(gpuswarm, repo)
        fast = try_edit(gpuswarm, repo, "LR to 0.045", LR="0.045")
        slow = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05", SLEEP="2.5")
        vs = variant_events(repo)
        assert vs[fast]["parent"] == vs[slow]["parent"]
        # the slow one beats the fast one's new BASE too (so it is a re-base candidate)
        assert expected_metric(0.05, 8) < expected_metric(0.045, 8) < expected_metric(0.04, 8)
        wait_all(gpuswarm, repo)

        variants, decided = assert_nothing_lost(repo)
        assert decided[fast]["status"] == "keep"
        assert decided[slow]["status"] == "discard"
        assert "conflicts" in decided[slow]["reason"], decided[slow]
        assert not [v for v in variants.values() if v["kind"] == "combo"]
        assert branch_tip(repo) == variants[fast]["commit"]
        assert float(decided[slow]["row"][1]) == pytest.approx(expected_metric(0.05, 8))
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)


# -- 6. agent proposer ---------------------------------------------------------------------------
FAKE_AGENT = r"""
import os, pathlib, re, sys, time
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.0)  # thinking
prompt = pathlib.Path(os.environ["GPUSWARM_PROMPT_FILE"])
n = len(list(prompt.parent.glob("prompt-*.md")))
depth = 8 + n
train = pathlib.Path("train.py")
train.write_text(re.sub(r"(?m)^DEPTH = .*$", f"DEPTH = {depth}", train.read_text()))
pathlib.Path(os.environ["GPUSWARM_MESSAGE_FILE"]).write_text(f"agent sets DEPTH to {depth}\n")
print("some chatter the message file overrides")
"""


@pytest.mark.timeout(90)
def test_loop_agent_proposer(gpuswarm: Cli, research_repo: Path, tmp_path: Path) -> None:
    repo = research_repo
    agent = tmp_path / "agent.py"
    agent.write_text(FAKE_AGENT)
    program = tmp_path / "program.md"
    program.write_text("# program\nPROGRAM-MARKER: get the lowest val_bpb\n")
    # one slot and no lookahead: the second proposal is made after the first result is in
    init(gpuswarm, repo, gpus="sim:1", mode="async")
    res = gpuswarm(
        "research",
        "loop",
        "-C",
        repo,
        "--proposer",
        "agent",
        "--agent-command",
        f"{shlex.quote(PY)} {shlex.quote(str(agent))}",
        "--program",
        program,
        "--lookahead",
        "0",
        "--controls",
        "off",
        "--max-experiments",
        "2",
        timeout=80,
    )
    try:
        assert res.returncode == 0, res
        variants, decided = assert_nothing_lost(repo)
        table = rows(repo)
        assert len(table) == 3, table
        descriptions = [r[4] for r in table]
        assert any(d.endswith("agent sets DEPTH to 9") for d in descriptions), descriptions
        assert any(d.endswith("agent sets DEPTH to 10") for d in descriptions), descriptions
        assert not any("chatter" in d for d in descriptions)
        agent_made = [v for v in variants.values() if v["source"] == "agent"]
        assert len(agent_made) == 2
        for v in agent_made:
            depth = int(v["description"].rsplit(" ", 1)[1])
            source = git(repo, "show", f"{v['commit']}:train.py")
            assert f"\nDEPTH = {depth}\n" in source
            assert decided[v["id"]]["status"] == "discard"  # deeper is worse here
        prompts = sorted((exp_dir(repo) / "prompts").glob("prompt-*.md"))
        assert len(prompts) == 2, prompts
        for p in prompts:
            assert "PROGRAM-MARKER" in p.read_text()
        last = prompts[-1].read_text()
        assert "## Recent results" in last
        assert "\tbaseline" in last, last
        assert "agent sets DEPTH to 9" in last, last
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)


@pytest.mark.timeout(60)
def test_loop_agent_failing_stops_the_loop(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path
) -> None:
    repo = research_repo
    agent = tmp_path / "bad_agent.py"
    agent.write_text("import sys\nprint('cannot reach the model')\nsys.exit(1)\n")
    init(gpuswarm, repo)
    res = gpuswarm(
        "research",
        "loop",
        "-C",
        repo,
        "--proposer",
        "agent",
        "--agent-command",
        f"{shlex.quote(PY)} {shlex.quote(str(agent))}",
        "--agent-max-failures",
        "2",
        "--max-experiments",
        "3",
    )
    try:
        assert res.returncode == 2, res
        assert "agent failed 2 times" in res.stderr, res
        assert "cannot reach the model" in res.stderr, res
        assert not variant_events(repo)
        assert rows(repo) == []
    finally:
        stop(gpuswarm, repo)


@pytest.mark.timeout(60)
def test_loop_rounds_slow_proposer_fills_the_round(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path
) -> None:
    """Rounds mode: one variant per GPU from one BASE, decided when all have finished. A
    proposer slower than a training run (an LLM agent, here 2.5 s vs ~0.5 s) must still fill
    the round: the first variant must not be decided, nor its round closed, before the second
    one is proposed."""
    repo = research_repo
    agent = tmp_path / "agent.py"
    agent.write_text(FAKE_AGENT)
    init(gpuswarm, repo, gpus="sim:2", mode="rounds")
    res = gpuswarm(
        "research",
        "loop",
        "-C",
        repo,
        "--mode",
        "rounds",
        "--proposer",
        "agent",
        "--agent-command",
        f"{shlex.quote(PY)} {shlex.quote(str(agent))} 2.5",
        "--max-experiments",
        "2",
        "--controls",  # a round of two GPUs' variants (a control would take one GPU)
        "off",
        timeout=50,
    )
    try:
        assert res.returncode == 0, res
        variants, decided = assert_nothing_lost(repo)
        made = [v for v in variants.values() if v["kind"] == "variant"]
        assert len(made) == 2, made
        assert [v["round"] for v in made] == [1, 1], (made, rows(repo))
        assert made[0]["parent"] == made[1]["parent"] == events(repo, "init")[0]["base"]
        assert decided[made[0]["id"]]["ts"] >= made[1]["ts"], "decided before its round was full"
        assert sum(r[4].startswith("[R1 gpu") for r in rows(repo)) == 2, rows(repo)
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)


# -- 8. confirmation runs of a would-be keep ---------------------------------------------------
LUCKY_TRAIN_PY = TRAIN_PY.replace("CRASH = 0\n", "CRASH = 0\nLUCKY = 0\n").replace(
    "for step in range(3):",
    "import os, pathlib\n"
    "mark = os.environ.get('LUCKY_MARK')\n"
    "if LUCKY and mark and not pathlib.Path(mark).exists():\n"
    "    pathlib.Path(mark).write_text('used')\n"
    "    val -= 0.2  # a lucky first run: its confirmation runs will not repeat it\n"
    "elif LUCKY and mark:\n"
    "    val += 0.15  # the knob really hurts\n"
    "for step in range(3):",
)


@pytest.mark.timeout(120)
def test_confirm_keeps_a_real_gain_and_rejects_a_lucky_run(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path
) -> None:
    repo = research_repo
    (repo / "train.py").write_text(LUCKY_TRAIN_PY)
    commit_all(repo, "lucky knob")
    env = {"LUCKY_MARK": str(tmp_path / "lucky.mark")}
    init(gpuswarm, repo, "--confirm", "2", "--linger", "60s", mode="async")  # one runner: one env
    try:
        res = gpuswarm("research", "baseline", "-C", repo, env=env)
        assert res.returncode == 0, res
        wait_all(gpuswarm, repo)
        real = try_edit(gpuswarm, repo, "LR to 0.05", LR="0.05")
        wait_all(gpuswarm, repo)
        edit_constant(repo, "LR", "0.04")
        res = gpuswarm("research", "restore", "-C", repo)
        lucky = try_edit(gpuswarm, repo, "lucky", LUCKY="1")
        wait_all(gpuswarm, repo)
        variants, decided = assert_nothing_lost(repo)
        assert decided[real]["status"] == "keep" and "confirmed" in decided[real]["reason"]
        assert decided[lucky]["status"] == "discard", decided[lucky]
        assert decided[lucky]["reason"].startswith("not confirmed"), decided[lucky]
        confirms = [v for v in variants.values() if v["kind"] == "confirm"]
        assert sorted(c["origin"] for c in confirms) == sorted([real, real, lucky, lucky])
        assert branch_tip(repo) == variants[real]["commit"]
        statuses = {r[4].split("] ", 1)[-1]: r[3] for r in rows(repo)}  # without [gpuN]
        assert statuses["LR to 0.05 (confirmation 1/2)"] == "keep"
        assert statuses["lucky (confirmation 2/2)"] == "discard"
    finally:
        stop(gpuswarm, repo)


# -- 9. several proposals at once ----------------------------------------------------------------
PARALLEL_AGENT = r"""
import os, pathlib, re, sys, time
log = pathlib.Path(sys.argv[1])
start = time.time()
time.sleep(1.0)  # thinking
n = int(pathlib.Path(os.environ["GPUSWARM_PROMPT_FILE"]).stem.split("-")[1])
train = pathlib.Path("train.py")
train.write_text(re.sub(r"(?m)^DEPTH = .*$", f"DEPTH = {8 + n}", train.read_text()))
pathlib.Path(os.environ["GPUSWARM_MESSAGE_FILE"]).write_text(f"agent {n}: DEPTH {8 + n}\n")
with log.open("a") as fh:
    fh.write(f"{start} {time.time()}\n")
"""


@pytest.mark.timeout(90)
def test_loop_runs_several_proposers_at_once(
    gpuswarm: Cli, research_repo: Path, tmp_path: Path
) -> None:
    repo = research_repo
    agent = tmp_path / "agent.py"
    agent.write_text(PARALLEL_AGENT)
    spans = tmp_path / "spans.txt"
    init(gpuswarm, repo, gpus="sim:3", mode="async")
    command = f"{shlex.quote(PY)} {shlex.quote(str(agent))} {shlex.quote(str(spans))}"
    res = gpuswarm(
        "research",
        "loop",
        "-C",
        repo,
        "--proposer",
        "agent",
        "--agent-command",
        command,
        "--proposers",
        "3",
        "--max-experiments",
        "6",
        timeout=80,
    )
    try:
        assert res.returncode == 0, res
        variants, _ = assert_nothing_lost(repo)
        made = [v for v in variants.values() if v["source"] == "agent"]
        assert len(made) == 6, made
        assert len({v["commit"] for v in made}) == 6  # each its own proposal, none lost
        prompts = sorted(p.name for p in (exp_dir(repo) / "prompts").glob("prompt-*.md"))
        assert prompts == [f"prompt-{n:04d}.md" for n in range(1, 7)]  # numbered, no clash
        intervals = [tuple(map(float, line.split())) for line in spans.read_text().splitlines()]
        overlapping = sum(
            1
            for i, (a0, a1) in enumerate(intervals)
            for b0, b1 in intervals[i + 1 :]
            if a0 < b1 and b0 < a1
        )
        assert overlapping >= 2, intervals  # the agents thought at the same time
    finally:
        stop(gpuswarm, repo)
    assert_no_processes(repo)
