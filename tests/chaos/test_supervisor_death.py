"""Scenario 3: SIGKILL one supervisor among three sharing a run (``lease_ttl: 2s``).

The survivors must notice (same host: the dead pid; every ``lease_ttl/3``), kill what the dead
one left running (its attempts keep ``GPUSWARM_OWNER`` in their environment), take its leases
back within a few ``lease_ttl`` and finish the run. A supervisor's death is never the task's
attempt (issue 28.5: one rule for resume, reclaim and ray's lost attempts): with
``max_attempts: 1`` as with 2 the reclaimed tasks run again and end done.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, env_processes, read_events, wait_for, wait_for_run
from harness import (
    HERE,
    PY,
    HeartbeatWatch,
    owner_of,
    q,
    running_leases,
    write_config,
)
from invariants import check_run

pytestmark = pytest.mark.slow

LEASE_TTL = 2.0


@dataclass
class Swarm:
    """Three supervisors on one run (``run`` + two ``work``, sim:2 each) and the chosen victim."""

    run_dir: Path
    ids: list[str]
    procs: list[CliProcess]
    owners: list[str]
    victim: CliProcess
    owner: str  # the victim's owner id

    def held(self) -> list[str]:
        return [name for name in running_leases(self.run_dir) if f"@{self.owner}@" in name]

    def survivors(self) -> list[CliProcess]:
        return [p for p in self.procs if p is not self.victim]

    def survivor_owners(self) -> list[str]:
        return [o for o in self.owners if o != self.owner]


def start_swarm(
    tmp_path: Path,
    shared: Path,
    cli_popen: Callable[..., CliProcess],
    rng: random.Random,
    max_attempts: int,
    long: float = 3.0,
    victim_index: int | None = None,
) -> Swarm:
    n = rng.randint(8, 12)
    effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    # the first six (one per slot) run `long` seconds on their first attempt, so that what the
    # victim holds is still running when it is reclaimed; the rest are short
    first = f'[ "$GPUSWARM_ATTEMPT" -ge 2 ] || sleep {long}; '
    tasks = [
        {
            "name": f"t{i:02d}",
            "command": f"{first if i < 6 else ''}sleep {rng.uniform(0.2, 0.6):.2f}; {effect}",
            "shell": True,
        }
        for i in range(n)
    ]
    top = {
        "name": "death",
        "workspace": "ws",
        "gpus": "sim:2",
        "grace": "1s",
        "defaults": {"max_attempts": max_attempts},
        "reliability": {"lease_ttl": f"{LEASE_TTL}s"},
    }
    config = write_config(tmp_path, top, tasks)
    victim_index = rng.randrange(3) if victim_index is None else victim_index
    print(f"{n} tasks, max_attempts {max_attempts}, victim: supervisor #{victim_index}")
    procs = [cli_popen("run", "-q", config)]
    run_dir = wait_for_run(tmp_path / "ws")
    procs += [cli_popen("work", run_dir, "--gpus", "sim:2", "-q") for _ in range(2)]
    owners = [owner_of(p, run_dir) for p in procs]
    swarm = Swarm(
        run_dir,
        [str(t["name"]) for t in tasks],
        procs,
        owners,
        procs[victim_index],
        owners[victim_index],
    )
    wait_for(lambda: len(swarm.held()) == 2, 20, 0.01, what=f"two leases of {swarm.owner}")
    time.sleep(rng.uniform(0.0, 0.3))
    return swarm


def task_of(lease_name: str) -> str:
    return lease_name.split("@")[0][14:-5]


@pytest.mark.trials(1)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_attempts", [1, 2])
def test_survivors_reclaim_a_killed_supervisors_tasks(
    tmp_path: Path,
    shared: Path,
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    seed: int,
    max_attempts: int,
) -> None:
    print(f"seed={seed}")
    # with max_attempts 1 the victim is `run` itself (issue 28.5: `run` + `work`, SIGKILL run)
    victim = 0 if max_attempts == 1 else None
    rng = random.Random(seed)
    swarm = start_swarm(tmp_path, shared, cli_popen, rng, max_attempts, victim_index=victim)
    owner, run_dir = swarm.owner, swarm.run_dir
    leases = swarm.held()
    leftovers = {p.pid for p in env_processes("GPUSWARM_OWNER", owner)}
    beats = HeartbeatWatch(run_dir, swarm.survivor_owners()).start()
    swarm.victim.send(signal.SIGKILL)
    t_kill = time.monotonic()
    assert swarm.victim.wait(10).returncode == -signal.SIGKILL
    lost_ids = sorted(task_of(name) for name in leases)
    print(f"seed={seed}: killed {owner} holding {lost_ids}, {len(leftovers)} task processes")
    assert leftovers, "the victim had no task process running"

    # reclaimed within a few lease_ttl: leases gone and leftover processes killed
    wait_for(lambda: not swarm.held(), 3 * LEASE_TTL + 2, 0.02, what=f"{owner} reclaimed")
    reclaimed_after = time.monotonic() - t_kill
    wait_for(
        lambda: not env_processes("GPUSWARM_OWNER", owner),
        3 * LEASE_TTL + 2,
        0.05,
        what=f"task processes of {owner} killed",
    )
    print(f"seed={seed}: reclaimed {reclaimed_after:.2f}s after the kill")

    codes = [p.wait(60).returncode for p in swarm.survivors()]
    oldest = beats.stop()
    # regression (found by this suite, fixed in 32bebe8): heartbeats were renewed every 5 s
    # whatever lease_ttl, so on another host these live supervisors would have looked dead
    assert oldest < LEASE_TTL, f"a survivor's heartbeat was {oldest:.1f}s old (lease_ttl 2s)"
    rep = check_run(run_dir, swarm.ids, shared=shared, allow_temp_files=True)
    events = read_events(run_dir)
    killed = [e for e in events if e["ev"] == "killed" and owner in e.get("reason", "")]
    # both survivors may kill (one finds what the other has not killed yet): any of them
    killed_pids = {pid for e in killed for pid in e["pids"]}
    assert killed and killed_pids & leftovers, f"no kill of {owner}'s attempts: {killed}"
    for tid in lost_ids:
        data = rep.descriptors[tid]
        lost = [a for a in data["attempts"] if a.get("kind") == "lost"]
        assert len(lost) == 1 and owner in lost[0]["reason"], data["attempts"]
        assert lost[0]["interrupted"] is True and data["interruptions"] == 1, data["attempts"]
        assert rep.states[tid] == "done", (tid, rep.states[tid], data["reason"])
    assert set(rep.states.values()) == {"done"}, rep.counts()
    assert codes == [0, 0], codes
    figures(
        "3 SIGKILL one of 3 supervisors (lease_ttl 2s)",
        tasks=len(swarm.ids),
        faults=1,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
        reexecuted=len(rep.reexecuted),
        silent_lost=len(rep.silent_lost),
        temp_files=len(rep.temp_files),
        reclaim_seconds=round(reclaimed_after, 2),
        heartbeat_age_seconds=round(oldest, 2),
    )


@pytest.mark.trials(1)
@pytest.mark.timeout(120)
def test_a_stopped_supervisor_hands_its_tasks_to_the_others(
    tmp_path: Path,
    shared: Path,
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    seed: int,
) -> None:
    """SIGTERM (warm) or SIGTERM twice (cold) to one of three: no reclaim needed, nothing lost."""
    rng = random.Random(seed)
    mode = rng.choice(["warm", "cold"])
    print(f"seed={seed}: {mode} stop")
    swarm = start_swarm(tmp_path, shared, cli_popen, rng, max_attempts=1, long=1.5)
    owner = swarm.owner
    handed = sorted(task_of(name) for name in swarm.held())
    swarm.victim.send(signal.SIGTERM)
    if mode == "cold":
        time.sleep(0.2)
        swarm.victim.send(signal.SIGTERM)
    res = swarm.victim.wait(30)
    assert res.returncode == 130, str(res)
    assert not swarm.held(), f"{owner} left leases behind: {swarm.held()}"
    assert not env_processes("GPUSWARM_OWNER", owner), "its attempts outlived it"

    codes = [p.wait(60).returncode for p in swarm.survivors()]
    assert codes == [0, 0], codes
    rep = check_run(swarm.run_dir, swarm.ids, shared=shared)
    assert set(rep.states.values()) == {"done"}, rep.counts()
    for tid in handed:  # interrupted, not counted: done with max_attempts 1
        attempts = rep.descriptors[tid]["attempts"]
        assert attempts[0]["interrupted"] is True and attempts[0]["kind"] == "cancelled"
        assert rep.descriptors[tid]["interruptions"] == 1
    reasons = [e.get("reason", "") for e in read_events(swarm.run_dir) if e["ev"] == "requeued"]
    assert not [r for r in reasons if "reclaimed" in r], reasons
    figures(
        "3b warm/cold stop of one of 3 supervisors",
        tasks=len(swarm.ids),
        faults=1,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
        reexecuted=len(rep.reexecuted),
    )


def test_reclaim_finishes_a_move_the_dead_supervisor_had_begun(
    tmp_path: Path,
    shared: Path,
    cli_popen: Callable[..., CliProcess],
) -> None:
    """Regression (found by this suite; fixed in 32bebe8): reclaim_dead ignored the 'state' a
    dead supervisor had saved just before its final rename, so an attempt that exited 0 was
    counted lost and its task ended failed 'abandoned' (or ran twice)."""
    effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    tasks = [{"name": "t0", "command": effect, "shell": True}]
    top = {"name": "half", "workspace": "ws", "gpus": "sim:1"}
    config = write_config(tmp_path, top, tasks)
    crash = [PY, str(HERE / "crashpoint.py"), "state-written:done", "--"]
    res = cli_popen("run", "-q", config, prefix=crash).wait(60)
    assert res.returncode == -signal.SIGKILL, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    # the dead supervisor's attempt exited 0 and its descriptor already says so
    (name,) = running_leases(run_dir)
    assert json.loads((run_dir / ".parallel/running" / name).read_text())["state"] == "done"

    res = cli_popen("work", run_dir, "--gpus", "sim:1", "-q").wait(60)
    par = run_dir / ".parallel"
    (path,) = [p for s in ("pending", "done", "failed") for p in (par / s).iterdir()]
    data = json.loads(path.read_text())
    assert path.parent.name == "done", f"{path.parent.name}: {data['reason']}, {data['attempts']}"
    assert (shared / "t0").read_text().split() == ["1"]
    check_run(run_dir, ["t0"], shared=shared)


def test_reclaiming_a_begun_requeue_costs_no_attempt(
    tmp_path: Path, shared: Path, cli_popen: Callable[..., CliProcess]
) -> None:
    """Regression (found by this suite; fixed in 3acf2c4): a dead supervisor's begun requeue
    for retry looked like a running attempt, so reclaim added a phantom 'lost' attempt that
    used the task's last attempt: failed 'abandoned' with an attempt left."""
    effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    flaky = f'[ "$GPUSWARM_ATTEMPT" -ge 2 ] || exit 1; {effect}'
    tasks = [{"name": "flaky", "command": flaky, "shell": True, "max_attempts": 2}]
    top: dict[str, Any] = {"name": "requeue", "workspace": "ws", "gpus": "sim:1"}
    top["reliability"] = {"retry_backoff": None}
    config = write_config(tmp_path, top, tasks)
    # attempt 1 failed; its supervisor saved the requeue (state 'pending') and died
    crash = [PY, str(HERE / "crashpoint.py"), "emit:finished:state=pending", "--"]
    res = cli_popen("run", "-q", config, prefix=crash).wait(60)
    assert res.returncode == -signal.SIGKILL, str(res)
    run_dir = wait_for_run(tmp_path / "ws")

    res = cli_popen("work", run_dir, "--gpus", "sim:1", "-q").wait(60)
    par = run_dir / ".parallel"
    (path,) = [p for s in ("pending", "done", "failed") for p in (par / s).iterdir()]
    data = json.loads(path.read_text())
    kinds = [a["kind"] for a in data["attempts"]]
    assert path.parent.name == "done", f"{path.parent.name}: {data['reason']}; {kinds}"
    assert kinds == ["exited", "exited"], kinds  # no attempt was lost


@pytest.mark.timeout(60)
def test_reclaiming_stubborn_leftovers_does_not_stall_the_heartbeat(
    tmp_path: Path, cli_popen: Callable[..., CliProcess]
) -> None:
    """Regression (found by this suite; fixed in 3acf2c4): reclaim ran in the keeper thread,
    whose kill_tree waited 10 s for leftovers that ignore SIGTERM: no heartbeat meanwhile."""
    stubborn = "trap '' TERM; sleep 30"
    tasks = [{"name": f"t{i}", "command": stubborn, "shell": True} for i in range(2)]
    top: dict[str, Any] = {"name": "stall", "workspace": "ws", "gpus": "sim:1"}
    top["reliability"] = {"lease_ttl": f"{LEASE_TTL}s"}
    config = write_config(tmp_path, top, tasks)
    survivor = cli_popen("run", "-q", config)
    run_dir = wait_for_run(tmp_path / "ws")
    victim = cli_popen("work", run_dir, "--gpus", "sim:1", "-q")
    owners = [owner_of(survivor, run_dir), owner_of(victim, run_dir)]
    wait_for(lambda: len(running_leases(run_dir)) == 2, 20, what="both tasks claimed")
    beats = HeartbeatWatch(run_dir, owners[:1]).start()
    victim.send(signal.SIGKILL)
    victim.wait(10)
    deadline = time.monotonic() + 2 * LEASE_TTL  # a stall shows within lease_ttl/3 + ttl
    while time.monotonic() < deadline and beats.oldest <= LEASE_TTL:
        time.sleep(0.05)
    oldest = beats.stop()
    print(f"oldest heartbeat of the reclaiming supervisor: {oldest:.1f}s")
    assert oldest < LEASE_TTL, f"the live supervisor's heartbeat was {oldest:.1f}s old"
