"""``gpuswarm logs`` and ``gpuswarm clean`` through the real CLI: a task's output found by id,
name prefix or bare run name; ``-f`` following a live task through its retry until it is done;
``clean`` removing only the finished run idle for long enough, never a young, live or crashed one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, wait_for, wait_for_run
from integration_support import kill_run_processes

from gpuswarm.core.paths import RunPaths

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]

# prints over ~2 s; the first attempt then fails, the second succeeds
TALKER_PY = r"""
import os, sys, time
n = os.environ["GPUSWARM_ATTEMPT"]
for i in range(8):
    print(f"attempt {n} line {i}", flush=True)
    time.sleep(0.25)
sys.exit(1 if n == "1" else 0)
"""

DAY = 86400.0


def _log_says(log: Path, text: str) -> bool:
    try:
        return text in log.read_text()
    except FileNotFoundError:
        return False


def _only_run(workspace: Path, name: str) -> Path:
    (run,) = (workspace / name).glob("run_*")
    return run


def _age(run: Path, days: float) -> None:
    """Set the run's last activity (summary.json, events.jsonl) ``days`` back."""
    when = time.time() - days * DAY
    for name in ("summary.json", "events.jsonl"):
        path = run / name
        if path.exists():
            os.utime(path, (when, when))


def _quick_run(gpuswarm: Cli, tmp_path: Path, name: str, *extra: str) -> Path:
    cmds = tmp_path / f"{name}.txt"
    cmds.write_text("echo hello one\necho hello two\nsh -c 'echo broken; exit 3'\n")
    res = gpuswarm("run", "--gpus", "sim:2", "-q", "--no-report", "--name", name, *extra, cmds)
    assert res.returncode == 1, str(res)  # one task failed
    return _only_run(tmp_path / "runs", name)


def test_logs_finds_the_task_by_id_name_prefix_and_bare_run_name(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    run = _quick_run(gpuswarm, tmp_path, "quick")

    by_id = gpuswarm("logs", run, "cmd-00001")
    assert by_id.returncode == 0 and by_id.stdout == "hello one\n", str(by_id)
    by_name = gpuswarm("logs", run.name, "echo hello t")  # a bare run name, found under ./runs
    assert by_name.returncode == 0 and by_name.stdout == "hello two\n", str(by_name)
    inside = gpuswarm("logs", run / "tasks", "cmd-00003")  # a path inside the run
    assert inside.returncode == 0 and inside.stdout == "broken\n", str(inside)

    js = gpuswarm("logs", "--json", run, "sh -c")
    assert js.returncode == 0, str(js)
    data = json.loads(js.stdout)
    log = RunPaths(run).attempt_log("cmd-00003", 1)
    assert data == {
        "task": "cmd-00003",
        "attempt": 1,
        "log": str(log),
        "state": "failed",
        "text": "broken\n",
        "truncated": False,
    }

    unknown = gpuswarm("logs", run, "nope")
    assert unknown.returncode == 2 and "'nope'" in unknown.stderr, str(unknown)
    ambiguous = gpuswarm("logs", run, "cmd-0000")
    assert ambiguous.returncode == 2, str(ambiguous)
    assert "ambiguous" in ambiguous.stderr
    assert all(f"cmd-0000{i}" in ambiguous.stderr for i in (1, 2, 3)), str(ambiguous)
    no_attempt = gpuswarm("logs", run, "cmd-00001", "--attempt", "2")
    assert no_attempt.returncode == 2 and "no attempt 2" in no_attempt.stderr, str(no_attempt)

    followed = gpuswarm("logs", "-f", run, "cmd-00002", timeout=30)  # ended: drained, done
    assert followed.returncode == 0 and followed.stdout == "hello two\n", str(followed)


def test_follow_shows_both_attempts_in_order_and_ends_when_the_task_is_done(
    tmp_path: Path, gpuswarm_popen: Popen
) -> None:
    script = tmp_path / "talker.py"
    script.write_text(TALKER_PY)
    cmds = tmp_path / "cmds.txt"
    cmds.write_text(f"{sys.executable} {script}\n")
    ws = tmp_path / "ws"
    runner = gpuswarm_popen(
        "run", "--gpus", "sim:1", "--max-attempts", "2", "--workspace", ws, cmds
    )
    run = wait_for_run(ws)
    log1 = RunPaths(run).attempt_log("cmd-00001", 1)
    wait_for(lambda: _log_says(log1, "attempt 1 line 0"), 30, what="attempt 1 to print")

    # --attempt 1: from the first attempt's start, however late this follower starts
    plain = gpuswarm_popen("logs", "-f", "--attempt", "1", run, "cmd-00001")
    as_json = gpuswarm_popen("logs", "-f", "--json", run, "cmd")  # from the attempt it finds
    followed = plain.wait(60)
    assert followed.returncode == 0, str(followed)
    want = [f"attempt 1 line {i}" for i in range(8)]
    want += ["==> gpuswarm: task cmd-00001, attempt 2 <=="]
    want += [f"attempt 2 line {i}" for i in range(8)]
    assert followed.stdout.splitlines() == want, str(followed)

    records = [json.loads(line) for line in as_json.wait(60).stdout.splitlines()]
    seen = [(r["attempt"], r["state"]) for r in records]
    assert seen in ([(1, "running"), (2, "running"), (2, "done")], [(2, "running"), (2, "done")])
    assert records[-1]["log"] == str(RunPaths(run).attempt_log("cmd-00001", 2))
    assert runner.wait(60).returncode == 0


def test_logs_of_a_pending_task_and_ctrl_c_of_a_follower(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("sh -c 'echo started; sleep 60'\necho later\n")
    ws = tmp_path / "ws"
    gpuswarm_popen("run", "--gpus", "sim:1", "--workspace", ws, cmds)
    run = wait_for_run(ws)
    log1 = RunPaths(run).attempt_log("cmd-00001", 1)
    wait_for(lambda: _log_says(log1, "started"), 30, what="the sleeper to start")

    pending = gpuswarm("logs", run, "cmd-00002")
    assert pending.returncode == 1 and "not started" in pending.stderr, str(pending)
    assert pending.stdout == ""

    follower = gpuswarm_popen("logs", "-f", run, "cmd-00001")
    wait_for(lambda: "started" in follower.stdout(), 30, what="the follower to print")
    follower.send(signal.SIGINT)
    stopped = follower.wait(20)
    assert stopped.returncode == 130 and stopped.stderr == "", str(stopped)


def test_clean_removes_only_the_old_finished_run(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    ws = tmp_path / "runs"
    old = _quick_run(gpuswarm, tmp_path, "old")
    young = _quick_run(gpuswarm, tmp_path, "young")
    sleeper = tmp_path / "sleeper.txt"
    sleeper.write_text("sh -c 'echo started; sleep 60'\n")
    live_cli = gpuswarm_popen("run", "--gpus", "sim:1", "--name", "live", sleeper)
    live = wait_for(lambda: list((ws / "live").glob("run_*")), 30, what="the live run")[0]
    log = RunPaths(live).attempt_log("cmd-00001", 1)
    wait_for(lambda: _log_says(log, "started"), 30, what="the live run's task to start")
    _age(old, 40)
    _age(live, 40)  # only its liveness keeps it

    dry = gpuswarm("clean", "--older-than", "30d", "--json")
    assert dry.returncode == 0, str(dry)
    (row,) = json.loads(dry.stdout)
    assert row["run"] == str(Path("runs") / "old" / old.name)
    assert row["state"] == "finished with failures" and row["removed"] is False
    assert row["age_s"] > 39 * DAY and row["bytes"] > 0
    human = gpuswarm("clean", "--older-than", "30d")
    assert human.returncode == 0 and "dry run" in human.stdout and old.name in human.stdout
    assert old.is_dir() and young.is_dir() and live.is_dir()  # a dry run removes nothing

    gone = gpuswarm("clean", "--older-than", "30d", "--yes", "--json")
    assert gone.returncode == 0, str(gone)
    assert [r["removed"] for r in json.loads(gone.stdout)] == [True]
    assert not old.exists() and young.is_dir() and live.is_dir()
    assert not [p.name for p in (ws / "old").iterdir()]  # no half-removed folder left behind
    assert gpuswarm("status", live).returncode == 0

    # its supervisor killed: crashed (its task in running/), never finished: kept
    live_cli.send(signal.SIGKILL)
    live_cli.wait(10)
    kill_run_processes(tmp_path)
    _age(live, 40)
    assert json.loads(gpuswarm("status", "--json", live).stdout)["state"] == "crashed"
    kept = gpuswarm("clean", ws, "--older-than", "1h", "--yes", "--json")
    assert kept.returncode == 0 and json.loads(kept.stdout) == [], str(kept)
    assert live.is_dir() and young.is_dir()

    bad = gpuswarm("clean", "--older-than", "soon")
    assert bad.returncode == 2 and "--older-than" in bad.stderr, str(bad)


def _run_in(gpuswarm: Cli, tmp_path: Path, workspace: Path, name: str) -> Path:
    cmds = tmp_path / f"{name}.txt"
    cmds.write_text("echo hello\n")
    res = gpuswarm("run", "--gpus", "sim:1", "-q", "--no-report", "--workspace", workspace,
                   "--name", name, cmds)  # fmt: skip
    assert res.returncode == 0, str(res)
    (run,) = (workspace / name).glob("run_*")
    _age(run, 40)
    return run


def test_clean_never_follows_a_link_out_of_the_workspace(tmp_path: Path, gpuswarm: Cli) -> None:
    """Issue 30: a name folder linked out of the workspace (ws/linkedname -> ../outside/c) and a
    run folder that is a link (ws/real/run_x -> outside/d/run_y) are reported as kept, never
    renamed, measured or removed; the real old run beside them goes."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    real = _run_in(gpuswarm, tmp_path, ws, "real")
    far_c = _run_in(gpuswarm, tmp_path, outside, "c")
    far_d = _run_in(gpuswarm, tmp_path, outside, "d")
    (ws / "linkedname").symlink_to(Path("..") / "outside" / "c")
    linked_run = ws / "real" / "run_20000101_000000_linked"
    linked_run.symlink_to(far_d)
    before = sorted(str(p) for p in outside.rglob("*"))

    dry = gpuswarm("clean", ws, "--older-than", "30d")
    assert dry.returncode == 0 and "symbolic link" in dry.stdout, str(dry)
    res = gpuswarm("clean", ws, "--older-than", "30d", "--yes", "--json")
    assert res.returncode == 1, str(res)  # some runs were kept
    # by the path it was found at, name folder included: the real run and the one reached
    # through linkedname/ have the same name when they were made in the same second
    rows = {str(Path(r["run"]).relative_to(ws)): r for r in json.loads(res.stdout)}
    seen_c = f"linkedname/{far_c.name}"
    assert rows[f"real/{real.name}"]["removed"] is True, rows
    for kept in (seen_c, f"real/{linked_run.name}"):
        assert rows[kept]["removed"] is False, rows
        assert "symbolic link" in rows[kept]["kept_because"], rows
    assert not real.exists()
    assert far_c.is_dir() and far_d.is_dir() and linked_run.is_symlink()
    assert sorted(str(p) for p in outside.rglob("*")) == before  # nothing outside changed
    hidden = [p.name for p in ws.rglob(".*") if ".removing-" in p.name]
    assert hidden == [], hidden


@pytest.mark.parametrize(
    ("plant", "kind"), [("ln -s /etc/hostname", "symlink"), ("mkfifo", "FIFO")]
)
def test_follow_of_a_log_the_task_replaced_says_why_and_fails(
    tmp_path: Path, gpuswarm: Cli, plant: str, kind: str
) -> None:
    """Issue 30: a task that swapped its output.log for a symlink or a FIFO left ``logs -f``
    silent with exit 0; now it exits 1 naming the file and why, never reading or blocking."""
    cmds = tmp_path / "cmds.txt"
    log = "attempt-$GPUSWARM_ATTEMPT/output.log"
    swap = f'cd "$GPUSWARM_TASK_WORKSPACE" && rm -f {log} && {plant} {log}'
    cmds.write_text(f"sh -c 'echo before; {swap}'\n")
    res = gpuswarm("run", "--gpus", "sim:1", "-q", "--no-report", "--name", "swap", cmds)
    assert res.returncode == 0, str(res)
    run = _only_run(tmp_path / "runs", "swap")
    path = RunPaths(run).attempt_log("cmd-00001", 1)
    for args in (["-f"], ["-f", "--json"]):
        out = gpuswarm("logs", run, "cmd-00001", *args, timeout=30)
        assert out.returncode == 1, str(out)
        assert str(path) in out.stderr and kind in out.stderr, str(out)
