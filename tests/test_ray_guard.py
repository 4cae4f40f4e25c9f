"""The slot actor's guard (``exec/ray/guard.py``) with real processes, no Ray: when its pipe
ends (the actor died), every process of a still-listed attempt ends -- its session, its group,
an escapee that made a session of its own but carries the token -- and nothing else does."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from gpuswarm.exec.ray.guard import TOKEN_VAR, Guard, end_attempts, serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def _tree(token: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    """An attempt as the actor starts it (own session, the token in its env): a shell with a
    child, and an escapee (``setsid``) that left its session; the pids of all three."""
    script = "sleep 30 & echo $!; setsid sleep 31 & echo $!; wait"
    proc = subprocess.Popen(
        ["sh", "-c", script],
        env={**os.environ, TOKEN_VAR: token},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    kids = [int(proc.stdout.readline()), int(proc.stdout.readline())]
    return proc, [proc.pid, *kids]


def _gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def trees() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for proc in made:
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
        except psutil.NoSuchProcess:
            pass
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_end_of_the_pipe_ends_every_listed_attempt_and_only_those(
    trees: list[subprocess.Popen[bytes]],
) -> None:
    kept, kept_pids = _tree("tok-ended")
    lost, lost_pids = _tree("tok-lost")
    trees.extend([kept, lost])
    lines = f"+ tok-ended {kept.pid} 0.5\n+ tok-lost {lost.pid} 0.5\n- tok-ended\n"
    serve(io.BytesIO(lines.encode()))  # returns once the pipe's end is read and acted on
    lost.wait(10)
    assert _gone(lost_pids), lost_pids  # the shell, its child and the escapee with the token
    assert all(psutil.pid_exists(p) for p in kept_pids)  # an attempt that ended is not touched


def test_a_process_that_ignores_term_is_killed_after_the_grace(
    trees: list[subprocess.Popen[bytes]],
) -> None:
    proc = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 30 & wait; sleep 30"],
        env={**os.environ, TOKEN_VAR: "tok"},
        start_new_session=True,
    )
    trees.append(proc)
    time.sleep(0.2)
    assert end_attempts({"tok": (proc.pid, 0.3)}) >= 1
    proc.wait(10)
    assert _gone([proc.pid])


def test_guard_process_ends_the_attempt_when_its_actor_dies(
    trees: list[subprocess.Popen[bytes]],
) -> None:
    """The real guard, started by a process that plays the actor: that process dies as Ray
    ends an actor whose raylet is gone (its direct children SIGKILLed, then itself), and the
    guard -- not among those children -- ends the attempt it was told of."""
    proc, pids = _tree("tok-g")
    trees.append(proc)
    actor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from gpuswarm.exec.ray.guard import Guard\n"
            "g = Guard()\n"
            f"g.watch('tok-g', {proc.pid}, 0.5)\n"
            "print('running' if g.running else 'no guard', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    assert actor.stdout is not None
    try:
        assert actor.stdout.readline().strip() == b"running"
        kids = psutil.Process(actor.pid).children()
        for kid in kids:  # what Ray's worker exit does (kill_child_processes_on_worker_exit)
            kid.kill()
        actor.kill()
        actor.wait(10)
    finally:
        actor.stdout.close()
    proc.wait(15)
    assert _gone(pids), pids


def test_guard_without_python_to_start_is_no_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    guard = Guard()
    assert not guard.running
    guard.watch("t", 1, 1.0)  # says nothing, fails nothing
    guard.unwatch("t")
