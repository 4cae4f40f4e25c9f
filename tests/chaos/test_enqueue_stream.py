"""Scenario 1c: SIGKILL a streamed enqueue half-way, then resume (issue 31).

A run of more than ``runsetup.STREAM_FIRST`` tasks is created with its first ones in pending/ and
the rest in ``.parallel/enqueue.spool``, which its supervisor moves into pending/ while the first
ones run (store/spool.py). The supervisor is killed after a chunk of that move (and, in the
second case, the resume that goes on with it too): while the spool is there ``status`` counts
every task, and a last ``resume`` must finish the enqueue and the run: every task done exactly
once, none lost, none written twice, the spool gone and ``enqueued`` journaled.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, wait_for_run
from harness import cmd_ids, write_commands
from invariants import check_run

from gpuswarm.app.setup import STREAM_FIRST
from gpuswarm.store.spool import CHUNK

pytestmark = pytest.mark.slow

N = STREAM_FIRST + 2 * CHUNK + 100  # three chunks to stream: a kill after the first leaves two
KILL = {"GPUSWARM_FAULTS": "spool.chunk:kill#1"}


@pytest.mark.parametrize("kills", [1, 2], ids=["run-killed", "run-and-resume-killed"])
def test_sigkill_mid_enqueue_then_resume(
    tmp_path: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    kills: int,
) -> None:
    cmds = write_commands(tmp_path, ["true"] * N)
    proc = cli_popen("run", "-q", "--gpus", "sim:4", "--workspace", "ws", cmds, env=KILL)
    res = proc.wait(120)
    assert res.returncode == -signal.SIGKILL, f"the enqueue was never streamed\n{res}"
    run_dir = wait_for_run(tmp_path / "ws")
    spool = run_dir / ".parallel" / "enqueue.spool"
    assert spool.is_file(), "the kill came after the spool was gone"
    for _ in range(kills - 1):  # the resume goes on with the spool, and is killed in it too
        res = cli_popen("resume", "-q", run_dir, env=KILL).wait(120)
        assert res.returncode == -signal.SIGKILL, str(res)
        assert spool.is_file()

    status = cli("status", run_dir, "--json")
    assert status.returncode == 0, str(status)
    shown = json.loads(status.stdout)
    assert shown["total"] == N, shown["counts"]  # the spooled tasks are counted, as pending

    final = cli("resume", "-q", run_dir, timeout=180)
    assert final.returncode == 0, str(final)
    assert not spool.exists()
    rep = check_run(run_dir, cmd_ids(N))
    assert set(rep.states.values()) == {"done"}, rep.counts()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["ev"] == "enqueued" for e in events)
