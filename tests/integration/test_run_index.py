"""The index of the user's runs (issue 33): runs made under their config's folders are found
from any folder by ``ls``, ``status`` (no argument: the newest; a run's name; a bare run name),
``resume --latest`` and ``dashboard``; "not found" lists the recent runs; a run folder that is
gone leaves the index; the index is private and never in the real home (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliResult, find_runs

from gpuswarm.store import runindex


def _two_runs(tmp_path: Path, gpuswarm: Callable[..., CliResult]) -> tuple[Path, Path]:
    """The README's examples' shape: two configs, each in a folder of its own, their runs
    under that folder (not ./runs)."""
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "run.yaml").write_text(
        "name: sweep\ntasks:\n  - {name: a, command: 'echo a'}\n"
    )
    (tmp_path / "batch").mkdir()
    (tmp_path / "batch" / "run.yaml").write_text(
        "name: batch\ntasks:\n  - {name: one, command: 'echo one'}\n"
    )
    first = gpuswarm("run", "--gpus", "sim:1", "--plain", "--no-report", "sweep/run.yaml")
    assert first.returncode == 0, first
    time.sleep(1.1)  # run names carry the second: two in one second share a bare name
    second = gpuswarm("run", "--gpus", "sim:1", "--plain", "--no-report", "batch/run.yaml")
    assert second.returncode == 0, second
    [sweep] = find_runs(tmp_path / "sweep" / "runs")
    [batch] = find_runs(tmp_path / "batch" / "runs")
    return sweep.resolve(), batch.resolve()


def test_runs_are_found_from_any_folder_and_gone_ones_leave_the_index(
    tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    sweep, batch = _two_runs(tmp_path, gpuswarm)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    ls = gpuswarm("ls", "--json", cwd=elsewhere)
    assert ls.returncode == 0, ls
    assert [row["run"] for row in json.loads(ls.stdout)] == [str(sweep), str(batch)]
    human = gpuswarm("ls", cwd=elsewhere)
    assert str(sweep) in human.stdout and str(batch) in human.stdout, human

    newest = gpuswarm("status", "--json", cwd=elsewhere)  # no argument: the newest run
    assert newest.returncode == 0, newest
    assert json.loads(newest.stdout)["run"] == str(batch)
    by_name = gpuswarm("status", "--json", "sweep", cwd=elsewhere)  # a run's name
    assert by_name.returncode == 0, by_name
    assert json.loads(by_name.stdout)["run"] == str(sweep)
    by_folder = gpuswarm("status", "--json", "sweep", cwd=tmp_path)  # beside a folder `sweep`
    assert json.loads(by_folder.stdout)["run"] == str(sweep), by_folder
    by_stamp = gpuswarm("status", "--json", sweep.name, cwd=elsewhere)  # a bare run name
    assert json.loads(by_stamp.stdout)["run"] == str(sweep), by_stamp

    missing = gpuswarm("status", "nosuch", cwd=elsewhere)
    assert missing.returncode == 2, missing
    assert "nosuch" in missing.stderr and "recent runs" in missing.stderr, missing
    assert str(sweep) in missing.stderr and str(batch) in missing.stderr, missing

    cleaned = gpuswarm("clean", "--older-than", "1m", cwd=elsewhere)  # no ./runs here
    assert cleaned.returncode == 2, cleaned
    assert f"your runs are under: {batch.parent.parent}, {sweep.parent.parent}" in cleaned.stderr

    resumed = gpuswarm("resume", "--latest", "--json", "--plain", "--no-report", cwd=elsewhere)
    assert resumed.returncode == 0, resumed
    assert json.loads(resumed.stdout)["path"] == str(batch)
    assert str(batch) in resumed.stderr  # it says which run it took

    # a run folder removed (here by `gpuswarm clean`, from another folder): its entry goes,
    # the others stay
    hour_ago = time.time() - 3600
    for name in ("summary.json", "events.jsonl"):  # idle for an hour
        os.utime(batch / name, (hour_ago, hour_ago))
    cleaned = gpuswarm("clean", batch.parent.parent, "--older-than", "1m", "--yes", cwd=elsewhere)
    assert cleaned.returncode == 0 and not batch.exists(), cleaned
    ls = gpuswarm("ls", "--json", cwd=elsewhere)
    assert [row["run"] for row in json.loads(ls.stdout)] == [str(sweep)]
    entries = list(runindex.index_dir().iterdir())
    assert len(entries) == 1 and str(sweep) in entries[0].read_text()
    # private: the folders 0700, the entries 0600
    for folder in (runindex.state_dir(), runindex.index_dir()):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(entries[0].stat().st_mode) == 0o600

    # an explicit workspace still means only that workspace
    ws = gpuswarm("ls", "--json", str(tmp_path / "sweep" / "runs"), cwd=elsewhere)
    assert len(json.loads(ws.stdout)) == 1
    none = gpuswarm("resume", "--latest", "--workspace", "runs", cwd=elsewhere)
    assert none.returncode == 2 and "no run" in none.stderr, none


def test_no_runs_anywhere_says_where_it_looked(
    tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    ls = gpuswarm("ls")
    assert ls.returncode == 0 and "no runs" in ls.stdout and "index" in ls.stdout, ls
    status = gpuswarm("status")
    assert status.returncode == 2 and "no run" in status.stderr, status
    assert not Path(os.environ[runindex.STATE_ENV]).is_relative_to(Path.home())


def test_a_research_experiments_run_is_found_from_any_folder(
    tmp_path: Path,
    gpuswarm: Callable[..., CliResult],
    research_repo: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``research init`` stages the experiment, its queue run inside, and renames it into
    place: the index points at the run where it ends up (it named the staging folder, pruned
    as gone: ``ls``, ``status`` and ``dashboard`` never found an experiment's runs)."""
    init = gpuswarm(
        "research", "init", "-C", research_repo, "--tag", "t", "--edit", "train.py",
        "--command", "python train.py", "--gpus", "sim:1",
    )  # fmt: skip
    assert init.returncode == 0, init
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ls = gpuswarm("ls", "--json", cwd=elsewhere)
    assert ls.returncode == 0, ls
    experiment = research_repo.resolve() / ".gpuswarm" / "research" / "t"
    assert [Path(row["run"]).parent for row in json.loads(ls.stdout)] == [experiment / "queue"]
    status = gpuswarm("status", "--json", cwd=elsewhere)
    assert Path(json.loads(status.stdout)["run"]).parent == experiment / "queue", status
    resumed = gpuswarm("resume", "--latest", "--plain", cwd=elsewhere)  # a batch run's verb
    assert resumed.returncode == 2 and "gpuswarm research loop" in resumed.stderr, resumed
    cleaned = gpuswarm("clean", "--older-than", "1m", cwd=elsewhere)  # research's: not named
    assert cleaned.returncode == 2 and "your runs are under" not in cleaned.stderr, cleaned
    from gpuswarm.cli.dashboard import _your_workspaces

    monkeypatch.chdir(elsewhere)
    assert _your_workspaces() == [experiment]  # the dashboard's default: the experiment


def test_a_run_the_index_lacks_is_indexed_once_resumed(
    tmp_path: Path, gpuswarm: Callable[..., CliResult]
) -> None:
    """A run made before the index existed (or on another host, joined with ``work``) is found
    from anywhere once it is resumed here; one the index has keeps its creation time."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "run.yaml").write_text(
        "name: old\ntasks:\n  - {name: a, command: 'true'}\n"
    )
    made = gpuswarm("run", "--gpus", "sim:1", "--plain", "--no-report", "old/run.yaml")
    assert made.returncode == 0, made
    [run] = find_runs(tmp_path / "old" / "runs")
    for entry in runindex.index_dir().iterdir():  # as if made before the index
        entry.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert json.loads(gpuswarm("ls", "--json", cwd=elsewhere).stdout) == []
    resumed = gpuswarm("resume", run, "--plain", "--no-report")
    assert resumed.returncode == 0, resumed
    rows = json.loads(gpuswarm("ls", "--json", cwd=elsewhere).stdout)
    assert [row["run"] for row in rows] == [str(run.resolve())]
    [entry] = runindex.index_dir().iterdir()
    created = json.loads(entry.read_text())["created"]
    again = gpuswarm("resume", run, "--plain", "--no-report")
    assert again.returncode == 0, again
    assert json.loads(entry.read_text())["created"] == created  # not re-dated
