"""Scenario 1b: SIGKILL at chosen points of the code, every time (crashpoint.py), then resume.

Random kills (test_sigkill_resume.py) land in the narrow windows around a transition (its
descriptor saved, its event journaled, its rename) only by chance; here each window is hit
deterministically, in ``run`` and then in the ``resume`` that repairs it. After the crash(es) a
plain ``gpuswarm resume`` must leave a run that satisfies every invariant, and ``gpuswarm check``
must agree. (Before 32bebe8 transitions were journaled after their rename: three of these cases
failed, a done task whose last event said 'started'; they are kept as regression tests.)
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, wait_for_run
from harness import HERE, PY, q, write_config
from invariants import check_run

pytestmark = pytest.mark.slow

CRASH = [PY, str(HERE / "crashpoint.py")]


def _tasks(shared: Path) -> list[dict[str, object]]:
    effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    tasks: list[dict[str, object]] = [
        {"name": f"ok{i}", "command": f"sleep 0.05; {effect}"} for i in range(4)
    ]
    tasks.append(  # fails its first attempt, then succeeds
        {"name": "flaky", "command": f'[ "$GPUSWARM_ATTEMPT" -ge 2 ] || exit 1; {effect}'}
    )
    tasks.append({"name": "broken", "command": "exit 3", "max_attempts": 1})
    for t in tasks:
        t["shell"] = True
    return tasks


# case: (crash point of `run`, crash point of the first `resume` or None, retry_backoff)
CASES = {
    "claimed-not-launched": ("claimed#3", None, None),
    "launched-not-journaled": ("emit:started#3", None, None),
    "done-saved-not-journaled": ("state-written:done#2", None, None),
    "done-journaled-not-renamed": ("emitted:finished:state=done#2", None, None),
    "retry-requeue-saved-not-renamed": ("emit:finished:state=pending", None, None),
    "retry-release-saved-not-renamed": ("emit:requeued:reason=retry", None, "0.3s"),
    "resume-requeue-saved-not-renamed": (
        "emitted:started#3",
        "emit:requeued:reason=interrupted",
        None,
    ),
    "resume-retry-failed-not-journaled": (
        "emitted:finished:state=failed",
        "emit:requeued:reason=resume-retry",
        None,
    ),
    "resume-finishing-move-not-journaled": ("state-written:done#2", "emit:recovered", None),
    "resume-finishing-move-journaled-not-renamed": (
        "state-written:done#2",
        "emitted:recovered",
        None,
    ),
}


@pytest.mark.parametrize(
    ("run_point", "resume_point", "backoff"), list(CASES.values()), ids=list(CASES)
)
def test_sigkill_at_a_crash_point_then_resume(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    run_point: str,
    resume_point: str | None,
    backoff: str | None,
) -> None:
    tasks = _tasks(shared)
    ids = [str(t["name"]) for t in tasks]
    top = {
        "name": "crash",
        "workspace": "ws",
        "gpus": "sim:1",  # one slot: no other transition is half-way when the crash point fires
        "grace": "1s",
        "defaults": {"max_attempts": 2},
        "reliability": {"retry_backoff": backoff},
    }
    config = write_config(tmp_path, top, tasks)
    proc = cli_popen("run", "-q", config, prefix=[*CRASH, run_point, "--"])
    res = proc.wait(60)
    assert res.returncode == -signal.SIGKILL, f"crash point {run_point} never reached\n{res}"
    run_dir = wait_for_run(tmp_path / "ws")
    faults = 1
    if resume_point is not None:
        proc = cli_popen("resume", "-q", run_dir, prefix=[*CRASH, resume_point, "--"])
        res = proc.wait(60)
        assert res.returncode == -signal.SIGKILL, f"crash point {resume_point} never reached\n{res}"
        faults += 1

    final = cli("resume", "-q", run_dir, timeout=60)
    assert final.returncode == 1, str(final)  # `broken` fails every time
    rep = check_run(run_dir, ids, shared=shared)
    states = {k: v for k, v in rep.states.items()}
    assert states.pop("broken") == "failed"
    assert set(states.values()) == {"done"}, rep.counts()
    figures(
        "1b SIGKILL at crash points + resume",
        tasks=len(ids),
        faults=faults,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
        reexecuted=len(rep.reexecuted),
    )


def test_resume_leaves_no_temp_file_of_a_killed_write(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
) -> None:
    tasks = _tasks(shared)
    top = {"name": "crash", "workspace": "ws", "gpus": "sim:1", "defaults": {"max_attempts": 2}}
    config = write_config(tmp_path, top, tasks)
    res = cli_popen("run", "-q", config, prefix=[*CRASH, "temp-left:done#2", "--"]).wait(60)
    assert res.returncode == -signal.SIGKILL, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    assert cli("resume", "-q", run_dir).returncode == 1  # `broken` fails
    check_run(run_dir, [str(t["name"]) for t in tasks], shared=shared)


def test_reclaim_leaves_no_temp_file_of_a_killed_write(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
) -> None:
    tasks = _tasks(shared)
    top = {"name": "crash", "workspace": "ws", "gpus": "sim:1", "defaults": {"max_attempts": 2}}
    config = write_config(tmp_path, top, tasks)
    res = cli_popen("run", "-q", config, prefix=[*CRASH, "temp-left:done#2", "--"]).wait(60)
    assert res.returncode == -signal.SIGKILL, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    assert cli("work", run_dir, "--gpus", "sim:1", "-q").returncode == 1  # `broken` fails
    check_run(run_dir, [str(t["name"]) for t in tasks], shared=shared)


@pytest.mark.parametrize("point", ["group-synced", "group-saved"])
def test_sigkill_inside_a_group_commit_then_resume(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    point: str,
) -> None:
    """Outcomes committed together (several slots ending at once: one flush for their saved
    descriptors, then each journaled and renamed): SIGKILL once the group's descriptors are
    durable and none is in place, or half-way through the group (one journaled and renamed,
    the next saved, not journaled). Resume loses nothing: every task ends done, each of its
    journaled outcomes stands, none is done twice in the journal."""
    effect = f"echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"
    tasks: list[dict[str, object]] = [
        {"name": f"t{i}", "command": effect, "shell": True} for i in range(40)
    ]
    top = {"name": "group", "workspace": "ws", "gpus": "sim:8", "grace": "1s"}
    config = write_config(tmp_path, top, tasks)
    res = cli_popen("run", "-q", config, prefix=[*CRASH, point, "--"]).wait(60)
    assert res.returncode == -signal.SIGKILL, f"no group commit reached {point}\n{res}"
    run_dir = wait_for_run(tmp_path / "ws")
    assert cli("resume", "-q", run_dir, timeout=60).returncode == 0
    rep = check_run(run_dir, [str(t["name"]) for t in tasks], shared=shared)
    assert set(rep.states.values()) == {"done"}, rep.counts()
