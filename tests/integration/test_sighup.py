"""A closed terminal (SIGHUP) stops a run as SIGTERM does: a warm stop that hands its running
tasks back, never a crash that leaves them running orphaned with the run read as crashed."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, read_events, wait_for, wait_for_run
from integration_support import read_results

pytestmark = pytest.mark.slow

Popen = Callable[..., CliProcess]


def test_sighup_is_a_warm_stop_named_as_such(tmp_path: Path, gpuswarm_popen: Popen) -> None:
    lines = tmp_path / "l.txt"
    lines.write_text("sleep 60\n" * 3)
    proc = gpuswarm_popen(
        "run", lines, "--gpus", "sim:1", "--plain", "--workspace", tmp_path / "ws"
    )
    run = wait_for_run(tmp_path / "ws")
    wait_for(lambda: any(e.get("ev") == "started" for e in read_events(run)), what="a task started")
    proc.send(signal.SIGHUP)
    result = proc.wait(40)  # below the test's timeout: a stall shows its stacks
    assert result.returncode == 130, result
    assert (
        "stopped by SIGHUP (the terminal closed): 1 running task put back in the queue, 2 pending"
    ) in result.stderr
    reason = read_results(run)["cmd-00001"]["reason"]
    assert reason.startswith("interrupted by SIGHUP"), reason
