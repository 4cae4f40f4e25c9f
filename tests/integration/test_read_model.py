"""One read model, seen from the CLI: after an attempt cut short by a SIGKILLed supervisor and a
resume, ``status`` and the view ``watch`` starts from name the same attempt and tail its log."""

from __future__ import annotations

import io
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, wait_for, wait_for_run
from rich.console import Console

from gpuswarm.core.paths import RunPaths
from gpuswarm.store.reader import RunReader
from gpuswarm.ui.table import LiveView

pytestmark = pytest.mark.slow

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]

TALKER_PY = r"""
import os, time
n = os.environ["GPUSWARM_ATTEMPT"]
for i in range(3000):
    print(f"attempt {n} line {i}", flush=True)
    time.sleep(0.02)
"""


def _log_says(log: Path, text: str) -> bool:
    try:
        return text in log.read_text()
    except FileNotFoundError:
        return False


def test_status_and_watch_agree_on_the_attempt_after_a_sigkill_and_resume(
    tmp_path: Path, gpuswarm: Cli, gpuswarm_popen: Popen
) -> None:
    script = tmp_path / "talker.py"
    script.write_text(TALKER_PY)
    cmds = tmp_path / "cmds.txt"
    cmds.write_text(f"{sys.executable} {script}\n")
    ws = tmp_path / "ws"
    first = gpuswarm_popen("run", "--gpus", "sim:1", "--workspace", ws, cmds)
    run_dir = wait_for_run(ws)
    paths = RunPaths(run_dir)
    log1, log2 = paths.attempt_log("cmd-00001", 1), paths.attempt_log("cmd-00001", 2)
    wait_for(lambda: _log_says(log1, "attempt 1 line"), 30, what="attempt 1 to print")
    first.send(signal.SIGKILL)
    first.wait(10)
    gpuswarm_popen("resume", run_dir)
    wait_for(lambda: _log_says(log2, "attempt 2 line"), 30, what="attempt 2 to print")

    status = gpuswarm("status", "--json", run_dir)
    assert status.returncode == 0, str(status)
    (row,) = json.loads(status.stdout)["running"]
    assert row["attempt"] == 2 and row["log"] == str(log2)

    view = RunReader(paths).view()  # what `gpuswarm watch` starts from
    (shown,) = [r for r in view.slots.values() if r.task == "cmd-00001"]
    assert shown.attempt == 2
    out = io.StringIO()
    Console(file=out, width=200).print(LiveView(view, paths.attempt_log, title="t").render())
    frame = out.getvalue()
    assert "attempt 2 line" in frame and "attempt 1 line" not in frame, frame
