"""Head loss under ``backend: ray`` is honest: the head of a real Ray cluster is SIGKILLed
while two attempts run on it; the driver notices within ``ray.head_timeout``, records both
attempts ``lost`` and puts them back in the queue, writes its summary and exits 1 with the
`resume` line; the attempts' processes on the node are ended (the slot actors' guards); on a
new cluster, ``gpuswarm resume RUN --ray-address NEW`` finishes every task once.

The test process never joins the first cluster: Ray ends every driver of a head that is gone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run
from raykit import LocalRayCluster, require_ray

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.timeout(240),
    pytest.mark.xdist_group("ray"),
]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is gone too
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _config(tmp: Path, address: str, ws: Path) -> Path:
    """Three tasks that write their pid and the pid of the sleep they wait for (their child:
    what a guard must end, since Ray kills only its actors' direct children), sleep as long as
    ``tmp/nap`` says, and record their end."""
    command = (
        f"sh -c 'echo $$ >> {tmp}/pids; sleep $(cat {tmp}/nap) & echo $! >> {tmp}/pids; "
        f"wait; echo $GPUSWARM_TASK_ID >> {tmp}/ends'"
    )
    config = tmp / "run.yaml"
    config.write_text(
        "backend: ray\n"
        f"ray: {{address: '{address}', head_timeout: 2s}}\n"
        f"workspace: {ws}\n"
        "tasks:\n"
        + "".join(f"  - {{name: t{i}, command: {json.dumps(command)}}}\n" for i in range(3))
    )
    return config


def _events(run: Path, ev: str) -> list[dict[str, Any]]:
    return [e for e in read_events(run) if e.get("ev") == ev]


def test_head_loss_loses_the_attempts_in_flight_and_resume_finishes_on_a_new_head(
    tmp_path: Path,
    gpuswarm: Callable[..., CliResult],
    gpuswarm_popen: Callable[..., CliProcess],
) -> None:
    require_ray()
    ws = tmp_path / "ws"
    first = LocalRayCluster(tmp_path / "a", nodes=1, connect=False)  # a head with 2 GPUs
    try:
        (tmp_path / "nap").write_text("60")
        config = _config(tmp_path, first.address, ws)
        proc = gpuswarm_popen("run", "--plain", "--no-report", config)
        run = wait_for_run(ws, timeout=60)
        pids_file = tmp_path / "pids"
        wait_for(lambda: pids_file.is_file() and len(pids_file.read_text().split()) >= 4, 60)
        pids = [int(p) for p in pids_file.read_text().split()]
        first.kill_head()
        result = proc.wait(timeout=90)
    finally:
        first.shutdown()
    assert result.returncode == 1, result  # unfinished, not interrupted by anyone
    assert "stopped answering" in result.stderr and "gpuswarm resume" in result.stderr, result
    # the attempts' processes went with their actors, the sleeps below them too
    wait_for(lambda: not any(_alive(p) for p in pids), 20, what=f"the attempts' pids {pids} gone")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["counts"]["pending"] == 3 and "stopped answering" in summary["stopped_by"]
    lost = sorted(e["task"] for e in _events(run, "requeued") if e.get("reason") == "lost")
    assert lost == ["t0", "t1"]  # the two in flight: back in the queue, not failed
    assert [e["change"] for e in _events(run, "slots")][-1] == "backend_lost"
    assert not (tmp_path / "ends").exists()

    (tmp_path / "nap").write_text("1")
    second = LocalRayCluster(tmp_path / "b", nodes=1)  # the cluster again, at a new address
    try:
        assert second.address != first.address
        resumed = gpuswarm(
            "resume", run, "--ray-address", second.address, "--plain", "--no-report", timeout=120
        )
        assert resumed.returncode == 0, resumed
        assert second.wait_no_actors() == []
    finally:
        second.shutdown()
    assert sorted((tmp_path / "ends").read_text().split()) == ["t0", "t1", "t2"]  # once each
    summary = json.loads((run / "summary.json").read_text())
    assert summary["counts"]["done"] == 3 and "stopped_by" not in summary
    for task, kinds in (("t0", ["lost", "exited"]), ("t1", ["lost", "exited"]), ("t2", ["exited"])):
        desc = json.loads(next((run / ".parallel" / "done").glob(f"*_{task}.json")).read_text())
        assert [a["kind"] for a in desc["attempts"]] == kinds, desc["attempts"]
