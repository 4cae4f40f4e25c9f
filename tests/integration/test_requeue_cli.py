"""``gpuswarm requeue RUN TASKS``: ended tasks, done ones included, back to pending as a fresh
attempt series, through the real CLI; then a resume runs them again."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, read_events, wait_for_run
from integration_support import descriptor

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]


def _json(result: CliResult) -> Any:
    assert result.returncode == 0, result
    return json.loads(result.stdout)


def test_requeue_runs_done_and_failed_tasks_again(tmp_path: Path, gpuswarm: Cli) -> None:
    flag = tmp_path / "flag"
    counter = tmp_path / "count"
    config = tmp_path / "c.yaml"
    tasks = [
        {"name": "ok", "command": f"echo x >> {counter}", "shell": True},
        {"name": "flaky", "command": f"test -e {flag}"},
    ]
    config.write_text(json.dumps({"tasks": tasks}))
    gpuswarm("run", config, "--gpus", "sim:2", "--plain", "--workspace", tmp_path / "ws")
    run = wait_for_run(tmp_path / "ws")
    assert counter.read_text() == "x\n"

    data = _json(gpuswarm("requeue", run, "ok", "flaky", "--json"))
    rows = {r["task"]: (r["was"], r["now"]) for r in data["tasks"]}
    assert rows == {"ok": ("done", "pending"), "flaky": ("failed", "pending")}
    assert data["live"] is False and "gpuswarm resume" in data["hint"]
    ok = descriptor(run, "ok")
    assert ok["state"] == "pending" and ok["budget_from"] == 1 and ok.get("result") is None
    assert len(ok["attempts"]) == 1  # the history is kept
    requeued = [e for e in read_events(run) if e.get("ev") == "requeued"]
    assert {(e["task"], e["frm"], e["reason"]) for e in requeued} == {
        ("ok", "done", "requeue"),
        ("flaky", "failed", "requeue"),
    }
    pending = _json(gpuswarm("requeue", run, "ok", "--json"))  # not ended: nothing to do
    assert pending["tasks"][0]["now"] == "pending" and "not ended" in pending["tasks"][0]["note"]

    flag.touch()
    result = gpuswarm("resume", run, "--plain", "--no-retry-failed")
    assert result.returncode == 0, result
    assert counter.read_text() == "x\nx\n"  # the done task ran again
    assert len(descriptor(run, "ok")["attempts"]) == 2
    assert len(descriptor(run, "flaky")["attempts"]) == 2
    unknown = gpuswarm("requeue", run, "nosuch")
    assert unknown.returncode == 2, unknown
    check = gpuswarm("check", run)
    assert check.returncode == 0, check
