"""after_all runs once per run as it is: again only when a task ended after its last run, in any
ended state (one that ended dependency_failed too, since retries can bring tasks back)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.supervise.after_all import _ran_since_last_end


@pytest.mark.parametrize("state", [s.value for s in State.terminal()])
def test_a_task_ended_after_the_last_run_means_run_again(tmp_path: Path, state: str) -> None:
    paths = RunPaths(tmp_path)
    log = tmp_path / "after_all.log"
    log.write_text("ran\n")
    os.utime(log, (1_000, 1_000))
    folder = paths.state_dir(state)
    folder.mkdir(parents=True)
    os.utime(folder, (900, 900))
    assert _ran_since_last_end(paths)  # nothing ended since it ran
    os.utime(folder, (1_100, 1_100))
    assert not _ran_since_last_end(paths), state
