"""The resume-retry arrow (failed -> pending) is saved, journaled, then renamed, like every arrow.

It used to rename first and journal second: a crash between the two left a task in pending/
whose last event said failed, and ``gpuswarm check`` said INCONSISTENT (``--repair`` could not
fix it). Now a crash after the save leaves the task in failed/ saved as ``pending``: check is
consistent (before or after the journal line), and the next resume finishes the move.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for_run
from harness import HERE, PY, write_config

pytestmark = pytest.mark.slow

CRASH = [PY, str(HERE / "crashpoint.py")]


@pytest.mark.parametrize(
    "point",
    ["emit:requeued:reason=resume-retry", "emitted:requeued:reason=resume-retry"],
    ids=["saved-not-journaled", "journaled-not-renamed"],
)
def test_a_crash_inside_the_resume_retry_arrow_leaves_a_consistent_run(
    tmp_path: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    point: str,
) -> None:
    tasks: list[dict[str, Any]] = [
        {"name": "ok", "command": "true"},
        {"name": "broken", "command": "exit 3", "shell": True},
    ]
    config = write_config(tmp_path, {"name": "arrow", "workspace": "ws", "gpus": "sim:1"}, tasks)
    assert cli("run", "-q", "--no-report", config).returncode == 1
    run_dir = wait_for_run(tmp_path / "ws")
    res = cli_popen("resume", "-q", "--no-report", run_dir, prefix=[*CRASH, point, "--"]).wait(60)
    assert res.returncode == -signal.SIGKILL, f"crash point {point} never reached\n{res}"

    report = json.loads(cli("check", run_dir, "--json").stdout)
    assert report["consistent"], report["findings"]  # was: journal says failed, folder pending
    assert report["counts"]["failed"] == 1, report["counts"]  # the rename never happened

    final = cli("resume", "-q", "--no-report", run_dir)
    assert final.returncode == 1, str(final)  # `broken` fails again, with a fresh budget
    report = json.loads(cli("check", run_dir, "--json").stdout)
    assert report["consistent"], report["findings"]
    (name,) = list((run_dir / ".parallel" / "failed").iterdir())
    data = json.loads(name.read_text())
    assert len(data["attempts"]) == 2 and data["budget_from"] == 1, data["attempts"]
    retries = [e for e in read_events(run_dir) if e.get("reason") == "resume-retry"]
    assert retries and all(e["task"] == "broken" for e in retries), retries
