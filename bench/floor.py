"""Floors of the throughput benchmark: what one task costs before any scheduler logic runs.

Two measurements, each a tight loop of bare system calls in this process, on the same disk as
the runs (no gpuswarm code, no Python logic between the calls):

- ``spawn_floor``: start ``true`` with ``posix_spawn`` (no shell) and reap it. The CPU of the
  child is what every tool pays per no-op task (the parent's share is reported apart);
- ``durable_floor``: the file work of one durable gpuswarm task, in the order gpuswarm does it:
  write its descriptor (enqueue), rename it to running/ + touch + read it back (claim), make the
  task and attempt folders and open the log (launch), write the outcome to a temp file + fsync
  + rename over the descriptor + rename to done/ (commit), and append two journal lines;
  done/ is fsynced once per 64 tasks, as the committer batches do.

The difference between these floors and gpuswarm's measured CPU per task is the interpreter
running the logic between the calls (see ``throughput.py``'s CPU rows).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

DESCRIPTOR = b'{"id":"cmd-00001","task":{"command":"true"},"attempts":[],"state":"pending"}' * 4
OUTCOME = DESCRIPTOR + b'{"n":1,"slot":"gpu0","kind":"exited","returncode":0}' * 3
EVENT = b'{"ts":1.0,"ev":"started","task":"cmd-00001","attempt":1,"slot":"gpu0"}\n'


def spawn_floor(n: int) -> tuple[float, float]:
    """(parent CPU ms, child CPU ms) per ``true`` started with posix_spawn and reaped."""
    true = shutil.which("true") or "/bin/true"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    before, cpu0 = os.times(), time.process_time()
    for _ in range(n):
        pid = os.posix_spawn(true, [true], env)
        os.waitpid(pid, 0)
    after, cpu1 = os.times(), time.process_time()
    child = (after.children_user + after.children_system) - (
        before.children_user + before.children_system
    )
    return (cpu1 - cpu0) / n * 1e3, child / n * 1e3


def durable_floor(folder: Path, n: int) -> float:
    """CPU ms per task of the durable file work alone (see the module docstring)."""
    dirs = {name: folder / name for name in ("pending", "running", "done", "tasks")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    journal = os.open(folder / "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    pending = os.open(dirs["pending"], os.O_RDONLY | os.O_DIRECTORY)
    for i in range(n):  # enqueue (no per-file fsync: one sync of the staged run)
        fd = os.open(f"t{i:06d}", flags, 0o644, dir_fd=pending)
        os.write(fd, DESCRIPTOR)
        os.close(fd)
    os.close(pending)
    os.sync()
    cpu0 = time.process_time()
    for i in range(n):
        name = f"t{i:06d}"
        running = f"{dirs['running']}/{name}"
        os.rename(f"{dirs['pending']}/{name}", running)  # claim
        os.utime(running)
        fd = os.open(running, os.O_RDONLY)
        os.read(fd, 65536)
        os.close(fd)
        task = f"{dirs['tasks']}/{name}"  # launch: workspace, attempt folder, log
        os.mkdir(task)  # noqa: PTH102 - bare calls, as gpuswarm makes them
        os.mkdir(f"{task}/attempt-1")  # noqa: PTH102
        os.close(os.open(f"{task}/attempt-1/output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND))
        os.write(journal, EVENT)
        tmp = f"{dirs['running']}/.tmp-{name}"  # commit
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, OUTCOME)
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, running)
        os.write(journal, EVENT)
        os.rename(running, f"{dirs['done']}/{name}")
        if i % 64 == 63:
            fd = os.open(dirs["done"], os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(fd)
            os.close(fd)
    cpu = time.process_time() - cpu0
    os.close(journal)
    return cpu / n * 1e3
