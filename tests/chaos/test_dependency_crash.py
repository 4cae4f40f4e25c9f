"""Issue 35: SIGKILL inside the dependency release, every time, then resume: no edge is lost and
nothing starts early.

Each dependent's command fails unless its prerequisite's side effect is there, so a dependent
released before its prerequisite was done ends failed (and the assertions below fail). The
crash points are the release's own (``release.marked``: a prerequisite's end mark written, its
dependents not settled; ``blocked.settle.saved``: a dependent's new state saved aside, not
journaled; ``blocked.settle.journaled``: journaled, not renamed) and the prerequisite's commit
(done journaled, not renamed), in ``run`` and in the ``resume`` that repairs it. After a plain
``resume`` every invariant holds (tests/chaos/invariants.py: one folder per task, the journal
agrees, ``gpuswarm check`` agrees) and every task ended where its rule says.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliProcess, CliResult, wait_for_run
from harness import HERE, PY, q, write_config
from invariants import check_run

pytestmark = pytest.mark.slow

CRASH = [PY, str(HERE / "crashpoint.py")]


def _tasks(shared: Path) -> list[dict[str, Any]]:
    def effect(needs: list[str]) -> str:
        checks = "".join(f"test -s {q(shared)}/{n} && " for n in needs)
        return f"{checks}echo $GPUSWARM_ATTEMPT >> {q(shared)}/$GPUSWARM_TASK_ID"

    tasks: list[dict[str, Any]] = [
        {"name": "a1", "command": f"sleep 0.05; {effect([])}"},
        {"name": "a2", "command": effect(["a1"]), "after": "a1"},
        {"name": "a3", "command": effect(["a2"]), "after": "a2"},
        {"name": "bad", "command": "exit 3"},
        {"name": "b1", "command": effect([]), "after": "bad"},
        {"name": "b2", "command": effect([]), "after": "b1"},
        {"name": "c", "command": effect([]), "after_any": "bad"},
        {"name": "d", "command": effect([]), "after_failed": "bad"},
        {"name": "e", "command": effect(["a3", "c"]), "after": ["a3", "c"]},
    ]
    for t in tasks:
        t["shell"] = True
    return tasks


FINAL = {
    **dict.fromkeys(["a1", "a2", "a3", "c", "d", "e"], "done"),
    "bad": "failed",
    "b1": "dependency_failed",
    "b2": "dependency_failed",
}

# case: (crash point of `run`, crash point of the first `resume` or None)
CASES = {
    "marked-not-settled": ("fault:release.marked", None),
    "released-saved-not-journaled": ("fault:blocked.settle.saved?state=pending", None),
    "released-journaled-not-renamed": ("fault:blocked.settle.journaled?state=pending#2", None),
    "dependency-failed-saved": ("fault:blocked.settle.saved?state=dependency_failed", None),
    "cascade-journaled-not-renamed": (
        "fault:blocked.settle.journaled?state=dependency_failed#2",
        None,
    ),
    "prerequisite-done-journaled-not-renamed": ("emitted:finished:state=done#1", None),
    "resume-settling-journaled-not-renamed": (
        "fault:release.marked",
        "fault:blocked.settle.journaled",
    ),
}


@pytest.mark.parametrize(("run_point", "resume_point"), list(CASES.values()), ids=list(CASES))
def test_sigkill_in_the_release_then_resume(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    run_point: str,
    resume_point: str | None,
) -> None:
    tasks = _tasks(shared)
    top = {"name": "deps", "workspace": "ws", "gpus": "sim:2", "grace": "1s"}
    config = write_config(tmp_path, top, tasks)
    res = cli_popen("run", "-q", config, prefix=[*CRASH, run_point, "--"]).wait(60)
    assert res.returncode == -signal.SIGKILL, f"crash point {run_point} never reached\n{res}"
    run_dir = wait_for_run(tmp_path / "ws")
    if resume_point is not None:
        res = cli_popen("resume", "-q", run_dir, prefix=[*CRASH, resume_point, "--"]).wait(60)
        assert res.returncode == -signal.SIGKILL, f"crash point {resume_point} never reached\n{res}"
    final = cli("resume", "-q", "--no-retry-failed", run_dir, timeout=60)
    assert final.returncode == 1, str(final)  # `bad` fails every time
    rep = check_run(run_dir, list(FINAL), shared=shared)
    assert rep.states == FINAL, rep.counts()
    figures("35 SIGKILL in the dependency release + resume", tasks=len(FINAL), lost=len(rep.lost))


@pytest.mark.parametrize(
    "run_point",
    ["fault:release.marked", "fault:blocked.settle.journaled?state=pending"],
    ids=["marked-not-settled", "released-journaled-not-renamed"],
)
def test_a_work_supervisor_finishes_the_release_of_a_killed_run(
    tmp_path: Path,
    shared: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    run_point: str,
) -> None:
    """`run` dies inside a release; a `work` supervisor joining the run (no resume) settles
    what it left and runs the rest: nothing lost, nothing early."""
    tasks = _tasks(shared)
    top: dict[str, Any] = {"name": "deps", "workspace": "ws", "gpus": "sim:1", "grace": "1s"}
    top["reliability"] = {"lease_ttl": "2s"}
    config = write_config(tmp_path, top, tasks)
    res = cli_popen("run", "-q", config, prefix=[*CRASH, run_point, "--"]).wait(60)
    assert res.returncode == -signal.SIGKILL, f"crash point {run_point} never reached\n{res}"
    run_dir = wait_for_run(tmp_path / "ws")
    res = cli("work", run_dir, "--gpus", "sim:2", "-q", timeout=60)
    assert res.returncode == 1, str(res)  # `bad` failed
    rep = check_run(run_dir, list(FINAL), shared=shared)
    assert rep.states == FINAL, rep.counts()
