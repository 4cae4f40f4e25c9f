"""The index of the user's runs (store/runindex.py): where it lives, its bound, concurrent
writers, and the dashboard's default folders from it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gpuswarm.core.paths import RunPaths
from gpuswarm.store import runindex
from gpuswarm.store.runs import NewRun, create_run


def test_state_dir_follows_xdg_then_home_and_the_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(runindex.STATE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert runindex.state_dir() == tmp_path / "home" / ".local" / "state" / "gpuswarm"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert runindex.state_dir() == tmp_path / "xdg" / "gpuswarm"
    monkeypatch.setenv("XDG_STATE_HOME", "relative")  # not absolute: ignored, as the spec says
    assert runindex.state_dir() == tmp_path / "home" / ".local" / "state" / "gpuswarm"
    monkeypatch.setenv(runindex.STATE_ENV, str(tmp_path / "mine"))
    assert runindex.state_dir() == tmp_path / "mine"


def _run(workspace: Path, name: str) -> RunPaths:
    return create_run(NewRun(name=name, workspace=workspace, info={"name": name}, tasks=[]))


def test_concurrent_creators_each_get_an_entry_and_the_index_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[RunPaths] = []
    lock = threading.Lock()

    def make(i: int) -> None:
        paths = _run(tmp_path / f"ws{i}", f"n{i}")
        with lock:
            made.append(paths)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(runindex.indexed_runs()) == sorted(p.root.resolve() for p in made)
    assert not [n for n in os.listdir(runindex.index_dir()) if n.startswith(".tmp-")]
    monkeypatch.setattr(runindex, "MAX_ENTRIES", 3)
    newest = _run(tmp_path / "later", "later")
    entries = os.listdir(runindex.index_dir())
    assert len(entries) == 3  # the oldest ones dropped
    assert newest.root.resolve() in runindex.indexed_runs()


def test_unwritable_index_never_fails_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(runindex.STATE_ENV, str(blocker / "state"))  # cannot be a folder
    paths = _run(tmp_path / "ws", "x")
    assert paths.is_run() and runindex.indexed_runs() == []


def test_dashboard_default_folders_are_runs_and_the_indexed_runs_workspaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuswarm.cli.dashboard import _your_workspaces

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert _your_workspaces() == [Path("runs")]  # nothing anywhere: ./runs (its error names it)
    _run(tmp_path / "a" / "runs", "one")
    _run(tmp_path / "a" / "runs", "two")
    _run(here / "runs", "local")
    assert _your_workspaces() == [(here / "runs").resolve(), (tmp_path / "a" / "runs").resolve()]
