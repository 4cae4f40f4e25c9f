"""Generic helpers for integration tests that drive the real ``gpuswarm`` CLI in subprocesses.

Fixtures (all function scoped):

- ``gpuswarm(*args, cwd=None, input=None, timeout=60, env=None) -> CliResult``: run the CLI to
  the end (``[sys.executable, "-m", "gpuswarm", *args]``), default cwd ``tmp_path``.
- ``gpuswarm_popen(*args, cwd=None, env=None) -> CliProcess``: start the CLI in its own session
  and process group (so a signal reaches only what the test aims at); stdout/stderr go to files.
  At teardown anything still running is SIGKILLed (the whole group) and waited for.
- ``run_reaper``: at teardown, SIGKILLs every process whose environment has a
  ``GPUSWARM_RUN_DIR`` under ``tmp_path`` (tasks orphaned by a killed supervisor), so one failing
  test never leaves sleepers behind for the next.

Plain helpers: :func:`wait_for`, :func:`find_runs`, :func:`wait_for_run`, :func:`read_events`,
:func:`queue_files`, :func:`run_processes`, :func:`wait_no_run_processes`, :func:`pid_running`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

STATES = ("pending", "running", "done", "failed")


# -- running the CLI ---------------------------------------------------------------------------
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
            f"--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"
        )


def cli_argv(*args: str | os.PathLike[str]) -> list[str]:
    return [sys.executable, "-m", "gpuswarm", *map(str, args)]


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GPUSWARM_RUN_DIR", None)  # never look like a task of some run ourselves
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "200")  # rich: no wrapping of long paths in messages
    env.update(extra or {})
    return env


def run_cli(
    *args: str | os.PathLike[str],
    cwd: Path,
    input: str | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> CliResult:
    argv = cli_argv(*args)
    t0 = time.monotonic()
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
        rc = self.popen.wait(timeout)
        seconds = time.monotonic() - self.started
        return CliResult(self.args, rc, self.stdout(), self.stderr(), seconds)

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
) -> CliProcess:
    log_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(log_dir.glob("cli-*.out")))
    out, err = log_dir / f"cli-{n}.out", log_dir / f"cli-{n}.err"
    argv = cli_argv(*args)
    with out.open("wb") as fo, err.open("wb") as fe:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            env=cli_env(env),
            start_new_session=True,
        )
    return CliProcess(argv[3:], popen, out, err)


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


def wait_for_run(workspace: Path, timeout: float = 20.0) -> Path:
    runs = wait_for(lambda: find_runs(workspace), timeout, what=f"a run under {workspace}")
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


def queue_files(run_dir: Path) -> dict[str, list[tuple[str, Path]]]:
    """task id -> [(state, descriptor path)] over the visible files of every state folder."""
    out: dict[str, list[tuple[str, Path]]] = {}
    for state in STATES:
        for path in sorted((run_dir / ".parallel" / state).iterdir()):
            if path.name.startswith("."):
                continue
            data = json.loads(path.read_text())
            out.setdefault(data["id"], []).append((state, path))
    return out


def task_states(run_dir: Path) -> dict[str, str]:
    """task id -> its one state; asserts that every task is in exactly one state folder."""
    files = queue_files(run_dir)
    dupes = {k: v for k, v in files.items() if len(v) != 1}
    assert not dupes, f"tasks in more than one state folder: {dupes}"
    return {k: v[0][0] for k, v in files.items()}


def descriptor(run_dir: Path, task_id: str) -> dict[str, Any]:
    (path,) = [p for _, p in queue_files(run_dir)[task_id]]
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def read_results(run_dir: Path) -> dict[str, dict[str, str]]:
    """results.tsv as task id -> row (column -> cell)."""
    lines = (run_dir / "results.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
    return {r["task"]: r for r in rows}


# -- processes ---------------------------------------------------------------------------------
def _real(path: Path | str) -> str:
    return os.path.realpath(path)


def run_processes(
    root: Path, *, under: bool = False, var: str = "GPUSWARM_RUN_DIR"
) -> list[psutil.Process]:
    """Live (non-zombie) processes whose ``var`` (``GPUSWARM_RUN_DIR``) is ``root`` (or below,
    ``under``)."""
    want = _real(root)
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            run_dir = proc.environ().get(var)
            if run_dir is None:
                continue
            got = _real(run_dir)
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


def wait_no_run_processes(root: Path, timeout: float = 10.0) -> None:
    """Wait until no live process of run ``root`` is left; fail naming the survivors."""
    deadline = time.monotonic() + timeout
    while True:
        procs = run_processes(root)
        reap_my_zombies({p.pid for p in procs})
        procs = [p for p in procs if pid_running(p.pid)]
        if not procs:
            return
        if time.monotonic() > deadline:
            desc = []
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    desc.append(f"{p.pid} ppid={p.ppid()} {p.cmdline()}")
            raise AssertionError(f"processes of {root} still alive after {timeout}s: {desc}")
        time.sleep(0.05)


def pid_running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_run_processes(root: Path) -> int:
    """SIGKILL the tasks of every run under ``root`` and the research runners of experiments
    under it (they are detached and would otherwise linger after the test)."""
    procs = run_processes(root, under=True, var="GPUSWARM_EXPERIMENT")
    procs += run_processes(root, under=True)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    if procs:
        psutil.wait_procs(procs, timeout=5)
        reap_my_zombies({p.pid for p in procs})
    return len(procs)


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture
def run_reaper(tmp_path: Path) -> Iterator[None]:
    yield
    kill_run_processes(tmp_path)


@pytest.fixture
def gpuswarm(tmp_path: Path, run_reaper: None) -> Callable[..., CliResult]:
    def call(
        *args: str | os.PathLike[str],
        cwd: Path | None = None,
        input: str | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
    ) -> CliResult:
        return run_cli(*args, cwd=cwd or tmp_path, input=input, timeout=timeout, env=env)

    return call


@pytest.fixture
def gpuswarm_popen(tmp_path: Path, run_reaper: None) -> Iterator[Callable[..., CliProcess]]:
    started: list[CliProcess] = []

    def start(
        *args: str | os.PathLike[str], cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> CliProcess:
        proc = start_cli(*args, cwd=cwd or tmp_path, log_dir=tmp_path / "_cli_logs", env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill_group()


# -- research --------------------------------------------------------------------------------
TRAIN_PY = """\
import sys
import time

LR = 0.04
DEPTH = 8
SLEEP = 0.2
CRASH = 0

time.sleep(SLEEP)
if CRASH:
    print("Traceback: RuntimeError: boom", file=sys.stderr)
    sys.exit(CRASH)
val = 0.9 + (LR - 0.05) ** 2 * 100 + abs(DEPTH - 6) * 0.01
for step in range(3):
    print(f"step {step}/3 loss {val + 1 - step * 0.1:.3f}", end="\\r", flush=True)
print()
print("---")
print(f"val_bpb:          {val:.6f}")
print("training_seconds: 0.2")
print(f"peak_vram_mb:     {45060.2 + DEPTH * 10:.1f}")
print(f"depth:            {DEPTH}")
"""

PREPARE_PY = "# fixed evaluation: read-only for variants\nSEQ_LEN = 2048\n"


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def make_research_repo(root: Path, train_py: str = TRAIN_PY) -> Path:
    """A git repo with the seed's layout: train.py (editable), prepare.py (protected)."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "master")
    git(root, "config", "user.email", "test@example.com")
    git(root, "config", "user.name", "test")
    (root / "train.py").write_text(train_py)
    (root / "prepare.py").write_text(PREPARE_PY)
    (root / "README.md").write_text("# tiny\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "initial")
    return root


def edit_constant(repo: Path, name: str, value: str) -> None:
    path = repo / "train.py"
    lines = path.read_text().splitlines(keepends=True)
    out = [f"{name} = {value}\n" if ln.startswith(f"{name} = ") else ln for ln in lines]
    path.write_text("".join(out))


def research_results(repo: Path, tag: str) -> list[list[str]]:
    """results.tsv rows (header included) as lists of cells."""
    text = (repo / ".gpuswarm" / "research" / tag / "results.tsv").read_text()
    return [line.split("\t") for line in text.splitlines()]


@pytest.fixture
def research_repo(tmp_path: Path, run_reaper: None) -> Path:
    return make_research_repo(tmp_path / "repo")
