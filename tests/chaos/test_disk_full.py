"""Scenario 8: the disk fills up in the middle of a run (a small tmpfs, filled by the test).

The run must say what happened (no traceback), stop with a non-zero exit, and keep its queue:
after the space is freed, ``resume`` finishes every task, each done exactly once. Needs root (to
mount the tmpfs); skipped cleanly where mounting is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_driver import CliProcess, CliResult, wait_for, wait_for_run
from harness import cmd_ids, write_commands
from invariants import check_run

pytestmark = pytest.mark.slow

TASKS = 40


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs at ``tmp_path/disk`` (unmounted at teardown)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"mount refused: {res.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to free the space)."""
    filler = disk / "filler"
    block = b"\0" * 65536
    with filler.open("wb", buffering=0) as fh:
        while True:
            try:
                fh.write(block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        with contextlib.suppress(OSError):  # the last pages too
            while fh.write(b"\0" * 512):
                pass
    return filler


@pytest.mark.timeout(180)
def test_disk_full_mid_run_stops_cleanly_and_resume_finishes(
    tmp_path: Path,
    small_disk: Path,
    cli: Callable[..., CliResult],
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
) -> None:
    cmds = write_commands(tmp_path, [f"sleep 0.3; echo task {i}" for i in range(TASKS)])
    ws = small_disk / "ws"
    proc = cli_popen("run", "--shell", "--gpus", "sim:2", "--workspace", ws, cmds)
    run_dir = wait_for_run(ws)
    done = run_dir / ".parallel/done"
    wait_for(lambda: len(os.listdir(done)) >= 4, 60, what="4 tasks done")
    filler = fill(small_disk)
    res = proc.wait(120)
    done_before = len(os.listdir(done))
    print(f"disk full after {done_before} of {TASKS} tasks; run exit {res.returncode}")
    assert done_before < TASKS, "the run ended before the disk was full"
    assert res.returncode == 1, str(res)
    assert "Traceback" not in res.output, str(res)
    assert "disk is full" in res.stderr and "gpuswarm resume" in res.stderr, str(res)

    filler.unlink()
    again = cli("resume", "-q", "--no-report", run_dir, timeout=120)
    assert again.returncode == 0, str(again)
    rep = check_run(run_dir, cmd_ids(TASKS))
    assert rep.counts() == {"done": TASKS}, rep.counts()
    figures(
        "8 disk full mid-run + resume",
        tasks=TASKS,
        faults=1,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
    )
