"""What the CLI says, word for word, where a newcomer tripped (issue 33): counted words
(``1 task``, ``1 attempt``, ``1 other slot``), who cancelled (a name, not ``0@vm:18106``),
what ``add`` says of the new tasks it gave another id, and each slot's ``start`` printed only
after the ``done`` of the task it ran before."""

from __future__ import annotations

import json
import os
import pwd
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]


def _yaml(path: Path, tasks: list[dict[str, Any]], **top: Any) -> Path:
    path.write_text(json.dumps({**top, "tasks": tasks}))  # JSON is YAML
    return path


def test_one_of_a_kind_is_singular_and_add_says_what_it_renamed(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    config = _yaml(tmp_path / "one.yaml", [{"name": "bad", "command": "false"}])
    ran = gpuswarm("run", config, "--gpus", "sim:1", "--plain", "--no-report", "--workspace", "ws")
    assert ran.returncode == 1, ran
    assert "1 task on 1 slot; run dir: " in ran.stderr and "1 tasks" not in ran.stderr, ran
    run = wait_for_run(tmp_path / "ws")
    status = gpuswarm("status", run)
    assert "1 task: " in status.stdout and "(1 attempt)" in status.stdout, status
    assert "1 tasks" not in status.stdout and "1 attempts" not in status.stdout, status
    more = _yaml(tmp_path / "more.yaml", [{"name": "bad", "command": "true"}])
    added = gpuswarm("add", run, more)
    assert added.returncode == 0, added
    assert f"added 1 task to {run}" in added.stdout, added
    assert "1 new task got a new id (the run has tasks of those ids): bad -> bad-2" in (
        added.stdout
    ), added
    assert "id(s)" not in added.stdout and "task(s)" not in added.stdout


def test_preflight_failing_on_two_slots_names_one_other_slot(tmp_path: Path, gpuswarm: Cli) -> None:
    config = _yaml(tmp_path / "pre.yaml", [{"name": "t", "command": "true"}], preflight=["false"])
    ran = gpuswarm("run", config, "--gpus", "sim:2", "--plain", "--no-report", "--workspace", "ws")
    assert ran.returncode == 2, ran
    assert "(and on 1 other slot)" in ran.stderr and "other slots" not in ran.stderr, ran


def test_cancel_says_who_by_name_even_without_user_in_the_environment(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Callable[..., CliProcess]
) -> None:
    script = tmp_path / "blocker.py"
    script.write_text(
        f"import os, time\nwhile not os.path.exists({str(tmp_path / 'go')!r}):\n"
        "    time.sleep(0.05)\n"
    )
    blocker = f"{sys.executable} {script}"
    config = _yaml(tmp_path / "live.yaml", [{"name": "blocker", "command": blocker}])
    proc = gpuswarm_popen("run", config, "--gpus", "sim:1", "--plain", "--workspace", "ws")
    run = wait_for_run(tmp_path / "ws")
    wait_for(lambda: any(e.get("ev") == "started" for e in read_events(run)), what="started")
    env = {k: v for k, v in os.environ.items() if k not in ("USER", "LOGNAME")}  # a container
    cancelled = gpuswarm("cancel", run, "blocker", "--wait", env=env)
    assert cancelled.returncode == 0, cancelled
    result = proc.wait(timeout=60)
    me = pwd.getpwuid(os.getuid()).pw_name
    line = next(line for line in result.stderr.splitlines() if " cancel " in line)
    assert re.search(rf"by {re.escape(me)}@\S+, pid \d+", line), result
    assert f"by {os.getuid()}@" not in result.stderr, result


def test_each_slot_prints_start_only_after_the_done_before_it(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    """Tasks that end at once: the slot claims the next before a committer thread journals
    the end of the last; the terminal still reads start, done, start, done per slot."""
    (tmp_path / "cmds.txt").write_text("true\n" * 40)
    ran = gpuswarm("run", "cmds.txt", "--gpus", "sim:2", "--plain", "--no-report")
    assert ran.returncode == 0, ran
    last: dict[str, str] = {}
    seen = 0
    for line in ran.stderr.splitlines():
        found = re.match(r"\S+ (\S+)\s+(start|done)\s+(\S+)", line)
        if not found:
            continue
        slot, what, _task = found.groups()
        if what == "start":
            assert last.get(slot, "done") == "done", f"{line!r} before the done:\n{ran.stderr}"
        else:
            assert last.get(slot) == "start", f"{line!r} without its start:\n{ran.stderr}"
        last[slot] = what
        seen += 1
    assert seen == 80, ran.stderr
