"""Scenario 7: a stalled supervisor on one host must not commit what another host reclaimed.

Two supervisors share one run as two hosts (each in its own UTS namespace, ``unshare -u`` with
another hostname, so neither can see the other's pids: only heartbeats tell), ``lease_ttl: 2s``.
The first is SIGSTOPped for about 7 s while it holds two tasks: one that ends while it is stopped,
one that still runs when it wakes. The second finds its heartbeat stale, reclaims both tasks and
re-runs them. After SIGCONT the first commits nothing (its fenced writes find the lease files
renamed away and never re-create them), kills the attempt that still runs, and journals
``lease_lost``. The journal has exactly one ``finished ... done`` per task and ``gpuswarm check``
is consistent. (Before the fencing the stalled supervisor's save re-created the lease file it had
lost, its rename moved the task to done/ a second time, and check said consistent.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, env_processes, read_events, wait_for, wait_for_run
from harness import owner_of, q, write_config

pytestmark = pytest.mark.slow

LEASE_TTL = 2.0
STOPPED_SECONDS = 7.0


def _host_prefix(hostname: str) -> list[str]:
    """Run the CLI in a new UTS namespace named ``hostname`` (the pid stays the CLI's)."""
    return [
        "unshare",
        "-u",
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        hostname,
        sys.executable,
        "-m",
        "gpuswarm",
    ]


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return os.system("unshare -u true >/dev/null 2>&1") == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare -u (UTS namespaces)")
@pytest.mark.timeout(120)
def test_a_stalled_supervisor_commits_nothing_another_host_reclaimed(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
) -> None:
    effect = f"echo $GPUSWARM_ATTEMPT-$(hostname) >> {q(shared)}/$GPUSWARM_TASK_ID"
    first = '[ "$GPUSWARM_ATTEMPT" -ge 2 ] || sleep {s}; '
    tasks = [  # first attempts: one ends while its supervisor is stopped, one outlives the stop
        {"name": "ends-while-stopped", "command": first.format(s=2) + effect, "shell": True},
        {"name": "outlives-the-stop", "command": first.format(s=60) + effect, "shell": True},
    ]
    top = {
        "name": "fence",
        "workspace": "ws",
        "gpus": "sim:2",
        "grace": "1s",
        "defaults": {"max_attempts": 3},
        "reliability": {"lease_ttl": f"{LEASE_TTL}s"},
    }
    config = write_config(tmp_path, top, tasks)
    a = cli_popen("run", "--plain", config, prefix=_host_prefix("host-a"))
    run_dir = wait_for_run(tmp_path / "ws")
    owner_a = owner_of(a, run_dir)
    assert owner_a.startswith("host-a:"), owner_a
    wait_for(
        lambda: sum(1 for e in read_events(run_dir) if e["ev"] == "started") == 2,
        20,
        what="host-a to start both tasks",
    )
    b = cli_popen("work", run_dir, "--gpus", "sim:2", "--plain", prefix=_host_prefix("host-b"))
    owner_b = owner_of(b, run_dir)
    assert owner_b.startswith("host-b:"), owner_b

    a.send(signal.SIGSTOP)
    t_stop = time.monotonic()
    try:
        # host-b sees a stale heartbeat, reclaims both tasks and re-runs them
        wait_for(
            lambda: all(
                any(
                    e["ev"] == "finished" and e["task"] == t and e.get("state") == "done"
                    for e in read_events(run_dir)
                )
                for t in ("ends-while-stopped", "outlives-the-stop")
            ),
            STOPPED_SECONDS + 10,
            0.05,
            what="host-b to reclaim and finish both tasks",
        )
        time.sleep(max(0.0, STOPPED_SECONDS - (time.monotonic() - t_stop)))
    finally:
        a.send(signal.SIGCONT)
    # host-a wakes up: its leftover attempt is killed (long before its 60 s sleep ends)
    wait_for(
        lambda: not env_processes("GPUSWARM_OWNER", owner_a),
        15,
        0.1,
        what="host-a's stale attempt to be killed",
    )
    ra, rb = a.wait(60), b.wait(60)
    events = read_events(run_dir)
    done = Counter(e["task"] for e in events if e["ev"] == "finished" and e["state"] == "done")
    assert done == {"ends-while-stopped": 1, "outlives-the-stop": 1}, (done, ra, rb)
    finished_by_a = [e for e in events if e["ev"] == "finished" and e["attempt"] == 1]
    assert not finished_by_a, finished_by_a  # host-a ran attempt 1 of both; host-b attempt 2
    lost = [e for e in events if e["ev"] == "lease_lost"]
    assert {e["task"] for e in lost} == {"ends-while-stopped", "outlives-the-stop"}, lost
    assert all(e["owner"] == owner_a for e in lost), lost
    # the run's folders: each task done once, nothing left in running/ (no re-created lease)
    done_files = os.listdir(run_dir / ".parallel" / "done")
    assert len(done_files) == 2, done_files
    assert not os.listdir(run_dir / ".parallel" / "running"), "a lease re-created (or a temp left)"
    for name in done_files:
        data = json.loads((run_dir / ".parallel" / "done" / name).read_text())
        kinds = [a.get("kind") for a in data["attempts"]]
        assert kinds[0] == "lost" and kinds[-1] == "exited", data["attempts"]
    rep = cli("check", run_dir, "--json")
    report = json.loads(rep.stdout)
    assert report["consistent"], report["findings"]
    # the stalled supervisor's first attempt did run to its end on host-a (a task cannot be
    # un-run), but its outcome was never committed: only host-b's lines count
    effects = (shared / "ends-while-stopped").read_text().split()
    assert "2-host-b" in effects, effects


def test_check_reports_a_task_finished_done_twice(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    """`gpuswarm check` names a duplicate completion in the journal (it said consistent)."""
    config = write_config(
        tmp_path, {"name": "dup", "workspace": "ws", "gpus": "sim:1"}, [{"command": "true"}]
    )
    assert cli("run", "-q", "--no-report", config).returncode == 0
    run_dir = wait_for_run(tmp_path / "ws")
    events = read_events(run_dir)
    finished = next(e for e in events if e["ev"] == "finished")
    started = next(e for e in events if e["ev"] == "started")
    with (run_dir / "events.jsonl").open("a") as fh:  # a second completion of the same task
        fh.write(json.dumps(started) + "\n")
        fh.write(json.dumps({**finished, "attempt": 2}) + "\n")
    rep = json.loads(cli("check", run_dir, "--json").stdout)
    assert not rep["consistent"]
    kinds = [f["kind"] for f in rep["findings"]]
    assert "duplicate-completion" in kinds, rep["findings"]
