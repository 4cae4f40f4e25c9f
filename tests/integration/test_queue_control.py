"""Queue control through the real CLI (issue 17): add, cancel, retry, pause/unpause, priority,
on a stopped run and on a live one; ``cancelled`` in the outputs and the exit code.

A live run is kept busy by a blocker task that waits for a file the test creates, so the
supervisor is there while the test changes its queue (its one slot is busy: the added tasks
wait for it, in priority order).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run
from integration_support import descriptor, read_results

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]


def _yaml(path: Path, tasks: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(json.dumps({**top, "tasks": tasks}))  # JSON is YAML
    return path


def _states(run: Path) -> dict[str, str]:
    """task id -> state folder (every state, cancelled included)."""
    out: dict[str, str] = {}
    for folder in (run / ".parallel").iterdir():
        if folder.name in ("pending", "running", "done", "failed", "skipped", "cancelled"):
            for f in folder.iterdir():
                if not f.name.startswith("."):
                    out[json.loads(f.read_text())["id"]] = folder.name
    return out


def _started_order(run: Path) -> list[str]:
    return [str(e["task"]) for e in read_events(run) if e.get("ev") == "started"]


def _json(result: CliResult) -> Any:
    assert result.returncode == 0, result
    return json.loads(result.stdout)


def _finished_run(tmp_path: Path, gpuswarm: Cli, tasks: list[dict[str, Any]]) -> Path:
    config = _yaml(tmp_path / "first.yaml", tasks)
    gpuswarm("run", config, "--gpus", "sim:1", "--plain", "--workspace", tmp_path / "ws")
    return wait_for_run(tmp_path / "ws")


def _blocker(tmp_path: Path) -> str:
    script = tmp_path / "blocker.py"
    go = tmp_path / "go"
    script.write_text(
        f"import os, time\nwhile not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
    )
    return f"{sys.executable} {script}"


def _live_run(
    tmp_path: Path, gpuswarm_popen: Popen, extra: list[dict[str, Any]]
) -> tuple[CliProcess, Path]:
    tasks = [{"name": "blocker", "command": _blocker(tmp_path), "priority": 100}, *extra]
    config = _yaml(tmp_path / "live.yaml", tasks)
    proc = gpuswarm_popen(
        "run", config, "--gpus", "sim:1", "--plain", "--workspace", tmp_path / "ws"
    )
    run = wait_for_run(tmp_path / "ws")
    wait_for(lambda: "blocker" in _started_order(run), what="the blocker started")
    return proc, run


def test_add_to_a_stopped_run_then_resume_honours_priority(tmp_path: Path, gpuswarm: Cli) -> None:
    run = _finished_run(tmp_path, gpuswarm, [{"name": "first", "command": "true"}])
    more = _yaml(
        tmp_path / "more.yaml",
        [
            {"name": "low", "command": "true", "priority": -1},
            {"name": "mid", "command": "true"},
            {"name": "high", "command": "true", "priority": 5},
            {"name": "first", "command": "true"},  # the run has this id: first-2
        ],
    )
    data = _json(gpuswarm("add", run, more, "--json"))
    assert data["added"] == 4
    assert data["ids"] == ["low", "mid", "high", "first-2"]
    assert data["renamed"] == {"first": "first-2"}
    assert data["live"] is False and "gpuswarm resume" in data["hint"]
    added = [e for e in read_events(run) if e.get("ev") == "added"]
    assert added and added[-1]["count"] == 4
    assert _states(run)["first-2"] == "pending"

    result = gpuswarm("resume", run, "--plain", "--gpus", "sim:1")
    assert result.returncode == 0, result
    assert _started_order(run)[1:] == ["high", "mid", "first-2", "low"]
    assert set(read_results(run)) == {"first", "first-2", "low", "mid", "high"}


def test_a_task_that_does_not_fit_the_run_is_refused(tmp_path: Path, gpuswarm: Cli) -> None:
    run = _finished_run(tmp_path, gpuswarm, [{"name": "first", "command": "true"}])
    tasks = [{"name": "wide", "command": "true", "gpus": 2}]
    wide = _yaml(tmp_path / "wide.yaml", tasks, gpus_per_task=2)  # fits its own config
    result = gpuswarm("add", run, wide)
    assert result.returncode == 2, result
    assert "gpus_per_task" in result.stderr and "'wide'" in result.stderr
    assert "wide" not in _states(run)


def test_add_to_a_live_run_from_stdin_goes_by_priority(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    proc, run = _live_run(tmp_path, gpuswarm_popen, [{"name": "queued", "command": "true"}])
    low = tmp_path / "low.txt"
    low.write_text("echo low\n")
    data = _json(gpuswarm("add", run, low, "--json"))
    assert data["live"] is True and data["hint"] == ""
    high = gpuswarm("add", run, "-", "--priority", "7", "--json", input="echo high\n")
    (high_id,) = _json(high)["ids"]
    assert high_id == "cmd-00001-2"  # the first add took cmd-00001
    (tmp_path / "go").touch()
    result = proc.wait()
    assert result.returncode == 0, result
    assert _started_order(run) == ["blocker", high_id, "queued", "cmd-00001"]


def test_cancel_of_a_pending_task_is_at_once_and_the_run_exits_0(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    proc, run = _live_run(
        tmp_path,
        gpuswarm_popen,
        [{"name": "doomed-task", "command": "false"}, {"name": "kept", "command": "true"}],
    )
    data = _json(gpuswarm("cancel", run, "doomed", "--reason", "not needed", "--json"))
    assert data["tasks"] == [
        {"task": "doomed-task", "was": "pending", "now": "cancelled", "note": ""}
    ]
    assert _states(run)["doomed-task"] == "cancelled"  # at once, by this command
    control = [e for e in read_events(run) if e.get("ev") == "control"]
    assert control[-1]["request"] == "cancel" and control[-1]["applied_by"] == control[-1]["by"]

    unknown = gpuswarm("cancel", run, "no-such-task")
    assert unknown.returncode == 2 and "'no-such-task'" in unknown.stderr, unknown
    (tmp_path / "go").touch()
    result = proc.wait()
    assert result.returncode == 0, result  # the only unfinished task is cancelled
    summary = json.loads((run / "summary.json").read_text())
    assert summary["counts"]["cancelled"] == 1 and summary["complete"] is True
    assert summary["failures"] == [] and summary["cancelled"][0]["task"] == "doomed-task"
    assert read_results(run)["doomed-task"]["state"] == "cancelled"
    assert "Cancelled (1)" in (run / "report.html").read_text()

    again = _json(gpuswarm("cancel", run, "kept", "--json"))  # ended already: nothing to do
    assert again["tasks"][0]["now"] == "done" and "nothing to do" in again["tasks"][0]["note"]
    strict = gpuswarm("resume", run, "--plain", "--strict", "--json")
    assert strict.returncode == 1, strict
    assert json.loads(strict.stdout)["exit_code"] == 1
    assert gpuswarm("resume", run, "--plain").returncode == 0
    status = _json(gpuswarm("status", run, "--json"))
    assert status["counts"]["cancelled"] == 1 and status["state"] == "complete"


def test_retry_failed_and_cancelled_then_resume(tmp_path: Path, gpuswarm: Cli) -> None:
    flag = tmp_path / "flag"
    run = _finished_run(
        tmp_path,
        gpuswarm,
        [
            {"name": "ok", "command": "true"},
            {"name": "flaky", "command": f"test -e {flag}"},
        ],
    )
    assert _states(run)["flaky"] == "failed"
    later = _yaml(tmp_path / "later.yaml", [{"name": "later", "command": "true"}])
    _json(gpuswarm("add", run, later, "--json"))
    _json(gpuswarm("cancel", run, "later", "--json"))
    assert _states(run)["later"] == "cancelled"

    done = gpuswarm("retry", run, "ok")
    assert done.returncode == 2 and "failed or cancelled" in done.stderr, done
    data = _json(gpuswarm("retry", run, "--failed", "--json"))
    assert [(r["task"], r["was"], r["now"]) for r in data["tasks"]] == [
        ("flaky", "failed", "pending")
    ]
    assert data["live"] is False and "gpuswarm resume" in data["hint"]
    data = _json(gpuswarm("retry", run, "--cancelled", "--json"))
    assert [(r["task"], r["now"]) for r in data["tasks"]] == [("later", "pending")]
    assert len(descriptor(run, "flaky")["attempts"]) == 1  # the history is kept

    flag.touch()
    result = gpuswarm("resume", run, "--plain", "--no-retry-failed")
    assert result.returncode == 0, result
    assert _states(run) == {"ok": "done", "flaky": "done", "later": "done"}
    assert len(descriptor(run, "flaky")["attempts"]) == 2
    check = gpuswarm("check", run)
    assert check.returncode == 0, check


def test_pause_unpause_and_priority(tmp_path: Path, gpuswarm: Cli) -> None:
    run = _finished_run(tmp_path, gpuswarm, [{"name": "first", "command": "true"}])
    more = _yaml(
        tmp_path / "more.yaml",
        [{"name": "a", "command": "true"}, {"name": "b", "command": "true"}],
    )
    _json(gpuswarm("add", run, more, "--json"))

    data = _json(gpuswarm("pause", run, "--json"))
    assert data["changed"] is True and data["paused"] is True
    assert _json(gpuswarm("pause", run, "--json"))["changed"] is False
    status = _json(gpuswarm("status", run, "--json"))
    assert status["paused"] == {"run": True, "slots": []}
    assert "paused: the run" in gpuswarm("status", run).stdout
    bad_slot = gpuswarm("pause", run, "--slot", "gpu99")
    assert bad_slot.returncode == 2 and "'gpu99'" in bad_slot.stderr, bad_slot
    slot_id = sorted(p.name for p in (run / ".parallel" / "slots").iterdir())[0]
    data = _json(gpuswarm("pause", run, "--slot", slot_id, "--json"))
    assert data["paused_slots"] == [slot_id]
    assert _json(gpuswarm("unpause", run, "--json"))["paused"] is False
    data = _json(gpuswarm("unpause", run, "--slot", slot_id, "--json"))
    assert data["paused_slots"] == []

    data = _json(gpuswarm("priority", run, "b", "9", "--json"))
    assert data == {"run": str(run.resolve()), "task": "b", "priority": 9, "was": 0}
    done = gpuswarm("priority", run, "first", "3")
    assert done.returncode == 2 and "pending tasks only" in done.stderr, done
    assert gpuswarm("priority", run, "a", "99999").returncode == 2
    result = gpuswarm("resume", run, "--plain", "--gpus", "sim:1")
    assert result.returncode == 0, result
    assert _started_order(run)[1:] == ["b", "a"]


def test_cancel_of_a_running_task_with_wait_and_a_paused_live_run(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    proc, run = _live_run(tmp_path, gpuswarm_popen, [])
    data = _json(gpuswarm("pause", run, "--json"))
    assert data["live"] is True and data["paused"] is True
    more = _yaml(tmp_path / "more.yaml", [{"name": "after", "command": "true"}])
    _json(gpuswarm("add", run, more, "--json"))
    data = _json(gpuswarm("cancel", run, "blocker", "--wait", "--timeout", "20", "--json"))
    assert data["timed_out"] is False
    assert data["tasks"][0]["was"] == "running" and data["tasks"][0]["now"] == "cancelled"
    assert _states(run)["blocker"] == "cancelled"
    assert _states(run)["after"] == "pending"  # paused: nothing new starts
    assert "after" not in _started_order(run)
    _json(gpuswarm("unpause", run, "--json"))
    result = proc.wait()
    assert result.returncode == 0, result
    assert _states(run) == {"blocker": "cancelled", "after": "done"}
    assert json.loads((run / "summary.json").read_text())["counts"]["failed"] == 0


def test_control_of_a_live_run_with_two_supervisors(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    """``run`` and ``work`` share the run, each busy with a blocker: a cancel reaches the one
    holding the task, an added task is claimed by whichever frees first, ls/status count it."""
    go2 = tmp_path / "go2"
    script = tmp_path / "blocker2.py"
    script.write_text(
        f"import os, time\nwhile not os.path.exists({str(go2)!r}):\n    time.sleep(0.05)\n"
    )
    extra = [{"name": "second", "command": f"{sys.executable} {script}", "priority": 50}]
    first, run = _live_run(tmp_path, gpuswarm_popen, extra)
    second = gpuswarm_popen("work", run, "--gpus", "sim:1", "--plain")
    wait_for(lambda: "second" in _started_order(run), what="the second supervisor's task")
    owners = {r["owner"] for r in _json(gpuswarm("status", run, "--json"))["running"]}
    assert len(owners) == 2, owners  # two supervisors, one task each

    data = _json(gpuswarm("cancel", run, "sec", "--wait", "--json"))  # a name prefix
    assert data["tasks"][0]["task"] == "second" and data["tasks"][0]["now"] == "cancelled"
    more = _yaml(tmp_path / "more.yaml", [{"name": "late", "command": "true"}])
    _json(gpuswarm("add", run, more, "--json"))
    wait_for(lambda: _states(run).get("late") == "done", what="the added task done")
    (tmp_path / "go").touch()
    assert first.wait().returncode == 0
    assert second.wait().returncode == 0
    assert _states(run) == {"blocker": "done", "second": "cancelled", "late": "done"}
    (row,) = _json(gpuswarm("ls", tmp_path / "ws", "--json"))
    assert row["counts"]["cancelled"] == 1 and row["state"] == "complete"
    assert "cancel" in gpuswarm("ls", tmp_path / "ws").stdout
    check = gpuswarm("check", run)
    assert check.returncode == 0, check


def test_add_of_10000_commands(tmp_path: Path, gpuswarm: Cli) -> None:
    run = _finished_run(tmp_path, gpuswarm, [{"name": "first", "command": "true"}])
    cmds = tmp_path / "many.txt"
    cmds.write_text("".join(f"echo {i}\n" for i in range(10_000)))
    data = _json(gpuswarm("add", run, cmds, "--json"))
    assert data["added"] == 10_000 and len(data["ids"]) == 100
    assert len(list((run / ".parallel" / "pending").iterdir())) == 10_000
    (added,) = [e for e in read_events(run) if e.get("ev") == "added"]
    assert added["count"] == 10_000 and len(added["ids"]) == 100
    status = _json(gpuswarm("status", run, "--json"))
    assert status["counts"]["pending"] == 10_000


@pytest.mark.parametrize(
    ("point", "added"), [("ledger.emit.before", False), ("ledger.emit.after", True)]
)
def test_an_add_killed_around_its_journal_line_is_finished_or_undone(
    tmp_path: Path, gpuswarm: Cli, point: str, added: bool
) -> None:
    """SIGKILL before the ``added`` line: the tasks were never added (removed); after it: the
    journal says they were, so the next control command (or resume) shows them."""
    run = _finished_run(tmp_path, gpuswarm, [{"name": "first", "command": "true"}])
    more = _yaml(tmp_path / "more.yaml", [{"name": "a", "command": "true"}])
    killed = gpuswarm("add", run, more, env={"GPUSWARM_FAULTS": f"{point}?ev=added:kill"})
    assert killed.returncode == -9, killed
    assert "a" not in _states(run)  # not visible yet
    _json(gpuswarm("pause", run, "--json"))  # any control command finishes what was left
    assert ("a" in _states(run)) is added
    assert not [n for n in (run / ".parallel" / "pending").iterdir() if n.name.startswith(".")]
    _json(gpuswarm("unpause", run, "--json"))
    result = gpuswarm("resume", run, "--plain")
    assert result.returncode == 0, result
    check = gpuswarm("check", run)
    assert check.returncode == 0, check
