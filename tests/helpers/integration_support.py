"""Plain helpers of the integration tests (imported by name; fixtures live in conftest.py).

Reading a run (:func:`queue_files`, :func:`task_states`, :func:`descriptor`,
:func:`read_results`), its processes (:func:`run_processes`, :func:`wait_no_run_processes`,
:func:`kill_run_processes`), research repositories (:func:`make_research_repo`, :func:`git`,
:func:`edit_constant`, :func:`research_results`). The CLI driver is ``cli_driver.py``.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from cli_driver import env_processes, kill_processes, pid_running, reap_my_zombies

STATES = ("pending", "running", "done", "failed")


# -- waiting and reading a run -----------------------------------------------------------------
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
def run_processes(
    root: Path, *, under: bool = False, var: str = "GPUSWARM_RUN_DIR"
) -> list[psutil.Process]:
    """Live (non-zombie) processes whose ``var`` (``GPUSWARM_RUN_DIR``) is ``root`` (or below,
    ``under``)."""
    return env_processes(var, str(root), under=under)


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


def kill_run_processes(root: Path) -> int:
    """SIGKILL the tasks of every run under ``root`` and the research runners of experiments
    under it (they are detached and would otherwise linger after the test)."""
    procs = run_processes(root, under=True, var="GPUSWARM_EXPERIMENT")
    procs += run_processes(root, under=True)
    return kill_processes(procs)


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


def research_ledger(repo: Path, tag: str) -> list[dict[str, Any]]:
    """The experiment's ledger.jsonl as events (none yet: []; a torn last line is skipped)."""
    path = repo / ".gpuswarm" / "research" / tag / "ledger.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a torn last line while someone writes
            continue
    return out
