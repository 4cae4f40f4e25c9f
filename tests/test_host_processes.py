"""Stopping processes that are no task (research runners): one that has exited but that its
parent has not reaped (a zombie: its parent may be a subreaper that never waits) counts as
stopped at once, not after the whole grace."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psutil
import pytest

from gpuswarm.exec.local import host_processes

PARENT = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen(['true'])\n"  # never waited for: a zombie of this parent
    "print(child.pid, flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.mark.timeout(30)
def test_a_zombie_that_is_not_ours_is_stopped_at_once() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    pid = -1
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        zombie = psutil.Process(pid)
        psutil.wait_procs([zombie], timeout=0)  # (not our child: psutil cannot reap it)
        while zombie.status() != psutil.STATUS_ZOMBIE:
            pass
        assert zombie.is_running()  # what psutil.wait_procs waited on for the whole grace
        # a grace far beyond the test's timeout: only a stop that sees it has ended passes
        assert host_processes.stop([pid], grace=600) == 1
    finally:
        parent.kill()
        parent.communicate()
        # where this process is a subreaper (tests that open a backend make it one), the
        # zombie is ours now: reap it (other tests count this process's zombies)
        if pid > 0:
            with contextlib.suppress(ChildProcessError):  # not ours: init reaps it
                os.waitpid(pid, 0)
