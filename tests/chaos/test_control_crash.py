"""Scenario 1c: SIGKILL of a supervisor around a cancel it applies, then ``gpuswarm resume``.

A running task is cancelled through a control request (``store.control.put``, what ``gpuswarm
cancel`` records); the supervisor that runs it stops the attempt and commits it ``cancelled``.
It is SIGKILLed at each point of that commit (crashpoint.py): the attempt ended, nothing of the
commit done; the cancelled descriptor saved, not journaled; journaled, not renamed. The resume
that follows must end the task cancelled exactly once (one transition in the journal, never a
retry though attempts are left), run the other tasks, drop the request, and leave a run every
invariant and ``gpuswarm check`` agree with.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, wait_for_run
from harness import HERE, PY, q, write_config
from invariants import check_run, read_events

from gpuswarm.core.paths import RunPaths
from gpuswarm.store import control

pytestmark = pytest.mark.slow

CRASH = [PY, str(HERE / "crashpoint.py")]

POINTS = {
    "ended-not-committed": "cancel-ended",
    "saved-not-journaled": "state-written:cancelled",
    "journaled-not-renamed": "emitted:control:state=cancelled",
}


def _running(run_dir: Path, task: str) -> bool:
    running = run_dir / ".parallel" / "running"
    names = os.listdir(running) if running.is_dir() else []  # leases, not temp files (".tmp-")
    return any(f"_{task}.json@" in n and not n.startswith(".") for n in names)


@pytest.mark.parametrize("point", list(POINTS.values()), ids=list(POINTS))
def test_sigkill_around_a_cancel_then_resume_cancels_once(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    point: str,
) -> None:
    effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    tasks: list[dict[str, object]] = [
        {"name": "victim", "command": "sleep 60", "priority": 10}  # cancelled: never ends
    ]
    tasks += [{"name": f"ok{i}", "command": f"sleep 0.05; {effect}"} for i in range(3)]
    for t in tasks:
        t["shell"] = True
    top = {
        "name": "cancel",
        "workspace": "ws",
        "gpus": "sim:1",  # the victim first, the others wait behind it
        "grace": "1s",
        "defaults": {"max_attempts": 3},
    }
    config = write_config(tmp_path, top, tasks)
    proc = cli_popen("run", "-q", config, prefix=[*CRASH, point, "--"])
    run_dir = wait_for_run(tmp_path / "ws")
    deadline = time.monotonic() + 30
    while not _running(run_dir, "victim"):
        assert time.monotonic() < deadline and proc.alive(), "the victim never ran"
        time.sleep(0.05)
    control.put(RunPaths(run_dir), "cancel", "victim")
    res = proc.wait(60)
    assert res.returncode == -signal.SIGKILL, f"crash point {point} never reached\n{res}"

    final = cli("resume", "-q", run_dir, timeout=60)
    assert final.returncode in (0, 1), str(final)  # the exit code of a cancel: the CLI's
    ids = [str(t["name"]) for t in tasks]
    rep = check_run(run_dir, ids, shared=shared)
    assert rep.states == {"victim": "cancelled", **{f"ok{i}": "done" for i in range(3)}}
    victim = rep.descriptors["victim"]
    assert len(victim["attempts"]) == 1, victim["attempts"]  # never retried
    assert victim["reason"].startswith("cancelled by ")
    events = read_events(run_dir)
    into_cancelled = [
        e
        for e in events
        if e.get("task") == "victim"
        and e.get("state") == "cancelled"
        and e["ev"] in ("control", "recovered")
    ]
    assert 1 <= len(into_cancelled) <= 2, into_cancelled  # a journaled move may be recovered
    assert sum(e["ev"] == "control" for e in into_cancelled) <= 1
    assert [e.get("task") for e in events if e["ev"] == "started"].count("victim") == 1
    assert control.requests(RunPaths(run_dir)) == []
