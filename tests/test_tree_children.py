"""The main thread's children file is kept open and re-read with pread (issue 31): each read
lists the children as they are now, never what an earlier read saw."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuswarm.exec.local import tree


def _spawn(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sleep", "30"]) for _ in range(n)]


def test_each_read_lists_the_children_of_now() -> None:
    before = set(tree._leader_children())
    procs = _spawn(3)  # launched by the main thread (pytest's): listed in its children file
    try:
        assert {p.pid for p in procs} <= set(tree._leader_children())
        procs[0].kill()
        procs[0].wait()  # reaped: gone from the next read
        now = set(tree._leader_children())
        assert procs[0].pid not in now
        assert {procs[1].pid, procs[2].pid} <= now
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert set(tree._leader_children()) <= before


def test_a_list_longer_than_one_read_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    procs = _spawn(40)
    try:
        monkeypatch.setattr(tree, "_READ_MAX", 16)  # a few pids fill one read: read it whole
        assert {p.pid for p in procs} <= set(tree._leader_children())
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_forked_child_reads_its_own_children() -> None:
    tree._leader_children()  # the parent's file is open now
    code = (
        "import os, subprocess, sys\n"
        "from gpuswarm.exec.local import tree\n"
        "p = subprocess.Popen(['sleep', '30'])\n"
        "ok = p.pid in tree._leader_children()\n"
        "p.kill(); p.wait()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    q = subprocess.Popen(['sleep', '30'])\n"
        "    mine = tree._leader_children()\n"
        "    q.kill(); q.wait()\n"
        "    os._exit(0 if mine == [q.pid] else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(0 if ok and os.waitstatus_to_exitcode(status) == 0 else 1)\n"
    )
    env = {**os.environ}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0
