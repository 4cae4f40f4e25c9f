"""The PATH search's cache (exec/local/programs.py): the file it names is the one ``execvp``
runs, within its TTL; a start with a remembered program that fails is made the long way."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuswarm.core.models import EndKind
from gpuswarm.exec.base import LaunchSpec
from gpuswarm.exec.local import programs
from gpuswarm.exec.local.process import Attempt
from gpuswarm.exec.local.tree import become_subreaper

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a subreaper")


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    become_subreaper()
    programs.forget()
    yield
    programs.forget()


def _tool(folder: Path, name: str, text: str, mode: int = 0o755) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho {text}\n")
    path.chmod(mode)
    return path


def _env(*folders: Path) -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([*map(str, folders), "/usr/bin", "/bin"])}


def _run(tmp_path: Path, argv: list[str], env: dict[str, str], name: str) -> tuple[str, str]:
    log = tmp_path / name / "output.log"
    end = Attempt.launch(LaunchSpec(argv, env, tmp_path, log)).wait()
    return end.reason, log.read_text().strip()


def test_the_found_file_is_the_first_executable_on_path(tmp_path: Path) -> None:
    _tool(tmp_path / "a", "tool", "a", mode=0o644)  # not executable: skipped, as execvp does
    second = _tool(tmp_path / "b", "tool", "b")
    env = _env(tmp_path / "a", tmp_path / "b")
    assert programs.program_path("tool", env) == str(second)
    assert programs.program_path("no-such-tool-xyz", env) is None


def test_no_search_for_a_path_or_a_relative_path_entry(tmp_path: Path) -> None:
    _tool(tmp_path / "b", "tool", "b")
    assert programs.program_path("./tool", _env(tmp_path / "b")) is None
    assert programs.program_path("", _env(tmp_path / "b")) is None
    relative = {"PATH": f"{tmp_path / 'b'}{os.pathsep}{os.pathsep}/usr/bin"}  # "": the cwd
    assert programs.program_path("tool", relative) is None
    assert programs.program_path("tool", {"PATH": f"bin{os.pathsep}{tmp_path / 'b'}"}) is None


def test_a_program_put_earlier_on_path_is_seen_after_the_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tool(tmp_path / "b", "tool", "b")
    env = _env(tmp_path / "a", tmp_path / "b")
    assert programs.program_path("tool", env) == str(tmp_path / "b" / "tool")
    first = _tool(tmp_path / "a", "tool", "a")
    assert programs.program_path("tool", env) == str(tmp_path / "b" / "tool")  # within the TTL
    monkeypatch.setattr(programs, "TTL", 0.0)
    assert programs.program_path("tool", env) == str(first)


@linux_only
def test_an_attempt_runs_what_execvp_runs(tmp_path: Path) -> None:
    _tool(tmp_path / "b", "tool", "from-b")
    env = _env(tmp_path / "a", tmp_path / "b")
    assert _run(tmp_path, ["tool"], env, "one") == ("exit 0", "from-b")
    assert _run(tmp_path, ["tool"], env, "two") == ("exit 0", "from-b")  # from the cache


@linux_only
def test_a_remembered_program_that_is_gone_is_reported_as_the_search_reports_it(
    tmp_path: Path,
) -> None:
    only = _tool(tmp_path / "b", "tool", "from-b")
    env = _env(tmp_path / "b")
    assert _run(tmp_path, ["tool"], env, "one") == ("exit 0", "from-b")
    only.unlink()  # the cache still names it
    log = tmp_path / "two" / "output.log"
    end = Attempt.launch(LaunchSpec(["tool"], env, tmp_path, log)).wait()
    assert (end.kind, end.reason) == (EndKind.NOT_FOUND, "command not found: tool")


@linux_only
def test_a_remembered_program_that_cannot_run_any_more_falls_back_to_a_later_entry(
    tmp_path: Path,
) -> None:
    first = _tool(tmp_path / "a", "tool", "from-a")
    _tool(tmp_path / "b", "tool", "from-b")
    env = _env(tmp_path / "a", tmp_path / "b")
    assert _run(tmp_path, ["tool"], env, "one") == ("exit 0", "from-a")
    first.write_bytes(b"\x7fELF-not-really")  # exec format error: execvp goes on to b
    assert _run(tmp_path, ["tool"], env, "two") == ("exit 0", "from-b")
