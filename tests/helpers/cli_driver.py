"""Driving the real ``gpuswarm`` CLI in subprocesses: shared by tests/integration and tests/chaos.

Plain functions and classes only (the fixtures that use them live in each folder's conftest);
``pythonpath`` in pyproject.toml puts this folder on ``sys.path``.

- :func:`run_cli` runs the CLI to the end in its own session and returns a :class:`CliResult`;
- :func:`start_cli` starts it in its own session and process group (so a signal reaches only
  what a test aims at), stdout/stderr to files, and returns a :class:`CliProcess`;
- ``prefix`` replaces ``[python, -m, gpuswarm]`` (a wrapper that crashes the CLI at a point).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil


@dataclass
class CliResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:  # shown by pytest when an assertion on the result fails
        return (
            f"gpuswarm {' '.join(self.args)} -> rc {self.returncode} in {self.seconds:.1f}s\n"
            f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"
        )


def cli_argv(*args: str | os.PathLike[str], prefix: list[str] | None = None) -> list[str]:
    return [*(prefix or [sys.executable, "-m", "gpuswarm"]), *map(str, args)]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("GPUSWARM_RUN_DIR", "GPUSWARM_OWNER", "GPUSWARM_ATTEMPT_TOKEN"):
        env.pop(var, None)  # never look like a task of some run ourselves
    env.pop("GPUSWARM_LOCK_DIR", None)  # a test that wants GPU locks names its own folder
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "200")  # rich: no wrapping of long paths in messages
    env.update(extra or {})
    return env


def terminal_signals() -> None:
    """Let the CLIs under test start with SIGINT and SIGHUP at their defaults, as from a
    terminal, even when the suite itself runs under ``nohup`` or as a background job: those
    start it with the two ignored, an ignored disposition is inherited across exec (a handled
    one is reset to the default), and gpuswarm keeps an ignored SIGHUP ignored, as nohup means
    (so a test of SIGHUP, or of Ctrl-C in a follower, would wait forever). The suite's own
    process keeps ignoring SIGHUP (a no-op handler) and gets Ctrl-C as Python's default."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _ignored)


def _ignored(signum: int, frame: object) -> None:
    """SIGHUP in the suite's own process: nothing (it was ignored)."""


def run_cli(
    *args: str | os.PathLike[str],
    cwd: Path,
    input: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> CliResult:
    argv = cli_argv(*args)
    t0 = time.monotonic()
    terminal_signals()
    proc = subprocess.run(
        argv,
        cwd=cwd,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(env),
        start_new_session=True,
    )
    return CliResult(argv[3:], proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


@dataclass
class CliProcess:
    """A CLI process started in its own session; stdout/stderr are files under ``log_dir``."""

    args: list[str]
    popen: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send(self, sig: int) -> None:
        """Send ``sig`` to the CLI process only (not its group), like a targeted kill(1)."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def wait(self, timeout: float = 60) -> CliResult:
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(self._stalled(timeout)) from None
        seconds = time.monotonic() - self.started
        return CliResult(self.args, rc, self.stdout(), self.stderr(), seconds)

    def _stalled(self, timeout: float) -> str:
        """What a CLI that did not end in time was doing: its stderr's tail and, where py-spy is
        installed, every thread's stack (a stall under load then names where it waits)."""
        stacks = "(py-spy is not installed: no stacks)"
        with contextlib.suppress(FileNotFoundError, subprocess.TimeoutExpired):
            dump = subprocess.run(
                ["py-spy", "dump", "--pid", str(self.popen.pid)],
                capture_output=True,
                text=True,
                timeout=20,
            )
            stacks = dump.stdout + dump.stderr
        return (
            f"{' '.join(self.args)} still running after {timeout:g}s\n"
            f"stderr's tail:\n{self.stderr()[-3000:]}\nstacks:\n{stacks[-6000:]}"
        )

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)


def start_cli(
    *args: str | os.PathLike[str],
    cwd: Path,
    log_dir: Path,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> CliProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(log_dir.glob("cli-*.out")))
    out, err = log_dir / f"cli-{n}.out", log_dir / f"cli-{n}.err"
    argv = cli_argv(*args, prefix=prefix)
    with out.open("wb") as fo, err.open("wb") as fe:
        terminal_signals()
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            env=cli_env(env),
            start_new_session=True,
        )
    return CliProcess([str(a) for a in args], popen, out, err)


# -- waiting and reading a run -----------------------------------------------------------------
def wait_for(
    cond: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``cond`` until it returns something truthy (returned); AssertionError at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        time.sleep(interval)


def find_runs(workspace: Path) -> list[Path]:
    """``<workspace>/<name>/run_*`` folders (staging folders excluded), sorted by name."""
    return sorted(p for p in workspace.glob("*/run_*") if (p / "run.json").is_file())


def wait_for_run(workspace: Path, timeout: float = 30.0) -> Path:
    runs: list[Path] = wait_for(
        lambda: find_runs(workspace), timeout, what=f"a run under {workspace}"
    )
    assert len(runs) == 1, runs
    return runs[0]


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Complete lines of events.jsonl (a torn last line is skipped)."""
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for raw in path.read_bytes().split(b"\n"):
        with contextlib.suppress(ValueError):
            if raw:
                out.append(json.loads(raw))
    return out


def count_events(run_dir: Path, ev: str, **match: Any) -> int:
    return sum(
        1
        for e in read_events(run_dir)
        if e.get("ev") == ev and all(e.get(k) == v for k, v in match.items())
    )


def pid_running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


_PATH_VARS = ("GPUSWARM_RUN_DIR", "GPUSWARM_EXPERIMENT")


def _real(path: Path | str) -> str:
    return os.path.realpath(path)


def env_processes(var: str, value: str, *, under: bool = False) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment has ``var`` == ``value`` (or a path below,
    ``under``); run and experiment folders are compared as real paths."""
    is_path = var in _PATH_VARS
    want = _real(value) if is_path else value
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            got = proc.environ().get(var)
            if got is None:
                continue
            got = _real(got) if is_path else got
            match = got == want or (under and got.startswith(want + os.sep))
            if match and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def reap_my_zombies(pids: set[int]) -> None:
    """Collect those of ``pids`` that ended up as our zombie children (if pytest is a subreaper)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def kill_processes(procs: list[psutil.Process]) -> int:
    """SIGKILL ``procs``, wait for them and reap the ones that were ours; how many there were."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    if procs:
        psutil.wait_procs(procs, timeout=5)
        reap_my_zombies({p.pid for p in procs})
    return len(procs)
