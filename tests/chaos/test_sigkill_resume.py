"""Scenario 1: SIGKILL the supervisor (and then the resuming one) at random moments; resume.

Each trial draws, from its seed: the number of tasks, slots, task lengths, which tasks fail their
first attempt (they are retried after a short backoff, so kills also land while a retry waits in
running/), and one or two kill moments. The first kill hits ``gpuswarm run``; a second one hits
the ``gpuswarm resume`` that repairs it. A last ``resume`` must finish the run: every task done
exactly once, nothing lost, no process of the run left.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, wait_for_run
from harness import q, summary, write_config
from invariants import check_run

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, shared: Path, rng: random.Random) -> tuple[Path, list[str], float]:
    n = rng.randint(16, 32)
    slots = rng.choice([2, 3, 4])
    tasks: list[dict[str, Any]] = []
    busy = 0.0
    for i in range(n):
        seconds = round(rng.uniform(0.05, 0.4), 2)
        busy += seconds
        flaky = rng.random() < 0.2  # fails its first attempt, then succeeds
        fail = '[ "$GPUSWARM_ATTEMPT" -ge 2 ] || exit 1; ' if flaky else ""
        effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
        tasks.append({"name": f"t{i:03d}", "command": f"sleep {seconds}; {fail}{effect}"})
    for t in tasks:
        t["shell"] = True
    top = {
        "name": "sigkill",
        "workspace": "ws",
        "gpus": f"sim:{slots}",
        "grace": "1s",
        "defaults": {"max_attempts": 2},
        "reliability": {"retry_backoff": rng.choice(["0.2s", "0.5s", None])},
    }
    path = write_config(tmp_path, top, tasks)
    return path, [t["name"] for t in tasks], busy / slots


@pytest.mark.trials(3)
def test_sigkill_supervisor_at_random_moments_then_resume(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    seed: int,
) -> None:
    rng = random.Random(seed)
    config, ids, estimate = _config(tmp_path, shared, rng)
    kills = rng.choice([1, 1, 2])
    print(f"seed={seed}: {len(ids)} tasks, ~{estimate:.1f}s of work per slot, {kills} kill(s)")

    proc = cli_popen("run", "-q", config)
    run_dir = wait_for_run(tmp_path / "ws")
    delivered = 0
    for k in range(kills):
        delay = rng.uniform(0.0, estimate * 1.2)
        time.sleep(delay)
        alive = proc.alive()
        proc.send(signal.SIGKILL)
        res = proc.wait(30)
        delivered += alive
        print(
            f"seed={seed}: kill {k + 1} after {delay:.2f}s: "
            f"{'SIGKILL delivered' if alive else f'already exited rc={res.returncode}'}"
        )
        if k + 1 < kills:
            proc = cli_popen("resume", "-q", run_dir)

    final = cli("resume", run_dir, "-q", timeout=120)
    assert final.returncode == 0, f"seed={seed}\n{final}"
    rep = check_run(run_dir, ids, shared=shared)
    assert set(rep.states.values()) == {"done"}, f"seed={seed}: {rep.counts()}"
    assert summary(run_dir)["complete"] is True
    figures(
        "1 SIGKILL supervisor + resume",
        tasks=len(ids),
        faults=delivered,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
        reexecuted=len(rep.reexecuted),
        silent_lost=len(rep.silent_lost),
        temp_files=len(rep.temp_files),
    )
