"""Scenario 2: four supervisors race over one run of thousands of short tasks.

``gpuswarm run --gpus sim:2`` and, as soon as its run folder exists, three
``gpuswarm work RUN --gpus sim:2``: eight slots in four processes claim from one queue by atomic
rename. No task fails, so every task must run exactly once: one side effect, one attempt, one
``started`` event, and every supervisor must have taken part (or the race proved nothing).
``GPUSWARM_CHAOS_RACE_TASKS`` sets the task count (default 2000).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, read_events, wait_for_run
from harness import cmd_ids, q, scale, write_commands
from invariants import check_run

pytestmark = pytest.mark.slow

TASKS = scale(2000, "GPUSWARM_CHAOS_RACE_TASKS")


@pytest.mark.trials(1)
@pytest.mark.timeout(300)
def test_four_supervisors_claim_each_task_exactly_once(
    tmp_path: Path,
    shared: Path,
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    stopwatch: Callable[[], float],
    seed: int,
) -> None:
    rng = random.Random(seed)
    claims = tmp_path / "claims.log"
    line = (
        f'echo "$GPUSWARM_TASK_ID $GPUSWARM_OWNER" >> {q(claims)}; '
        f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    )
    cmds = write_commands(tmp_path, [line] * TASKS)
    ws = tmp_path / "ws"
    stagger = [round(rng.uniform(0.0, 0.3), 3) for _ in range(3)]
    print(f"seed={seed}: {TASKS} tasks, work supervisors started after {stagger} s")

    procs = [cli_popen("run", "--gpus", "sim:2", "--shell", "-q", "--workspace", ws, cmds)]
    run_dir = wait_for_run(ws, timeout=60)
    for delay in stagger:
        time.sleep(delay)
        procs.append(cli_popen("work", run_dir, "--gpus", "sim:2", "-q"))
    results = [p.wait(240) for p in procs]
    elapsed = stopwatch()
    for res in results:
        assert res.returncode == 0, f"seed={seed}\n{res}"

    ids = cmd_ids(TASKS)
    rep = check_run(run_dir, ids, shared=shared, settle=15)
    assert set(rep.states.values()) == {"done"}, rep.counts()
    for tid, data in rep.descriptors.items():
        assert len(data["attempts"]) == 1, (tid, data["attempts"])
    side = Counter(int(n) for tid in ids for n in (shared / tid).read_text().split())
    assert side == Counter({1: TASKS}), f"side effects per attempt number: {side}"

    owners = [e["owner"] for e in read_events(run_dir) if e["ev"] == "supervisor_started"]
    assert len(set(owners)) == 4, owners
    by_task = Counter(ln.split()[0] for ln in claims.read_text().splitlines())
    twice = [t for t, n in by_task.items() if n != 1]
    assert not twice and len(by_task) == TASKS, f"run more than once: {twice[:10]}"
    share = Counter(ln.split()[1] for ln in claims.read_text().splitlines())
    print(f"seed={seed}: {elapsed:.1f}s; tasks per supervisor: {sorted(share.values())}")
    assert len(share) == 4, f"not every supervisor claimed: {share}"
    figures(
        "2 four supervisors racing",
        tasks=TASKS,
        faults=0,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates) + len(twice),
        seconds=round(elapsed, 1),
    )
