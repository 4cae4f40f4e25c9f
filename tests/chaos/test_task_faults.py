"""Scenario 4: tasks that fail in every way a task can, in one run; the slot circuit breaker.

The run survives each of them and classifies each one (exit code, signal, timeout, not found);
escaped processes die with their attempt; a task flooding stdout keeps its log bounded and the
supervisor's memory flat; a retried task is done once. Then a run where every task fails on
every slot: the tasks' fault, so the breaker quarantines no slot (issue 11).
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_driver import CliProcess, CliResult, pid_running, read_events, wait_for, wait_for_run
from harness import HERE, PY, summary, write_config
from invariants import check_run

pytestmark = pytest.mark.slow

FAULTY = str(HERE / "faulty.py")
FLOOD_MB = 200
MAX_LOG_MB = 1
RSS_LIMIT = 200 << 20


def _gone(pid: int) -> bool:
    return not pid_running(pid)


def task(name: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": [PY, FAULTY, *args], **extra}


class Sampler:
    """Samples a process's RSS and a file's size every 10 ms in a thread."""

    def __init__(self, pid: int, log: Callable[[], Path | None]) -> None:
        self.proc = psutil.Process(pid)
        self.log = log
        self.rss: list[int] = []
        self.log_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        """Samples once the log exists (the supervisor is up and the flood started)."""
        while not self._stop.wait(0.01):
            path = self.log()
            if path is None:
                continue
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            if rss > 0:  # 0 once it is a zombie
                self.rss.append(rss)
            with contextlib.suppress(OSError):
                self.log_peak = max(self.log_peak, path.stat().st_size)


@pytest.mark.trials(1)
def test_every_kind_of_task_fault_in_one_run(
    tmp_path: Path,
    shared: Path,
    cli_popen: Callable[..., CliProcess],
    figures: Callable[..., None],
    seed: int,
) -> None:
    pids = {k: tmp_path / f"{k}.pid" for k in ("escape-exit", "escape-hang")}
    tasks = [
        task("ok", "ok"),
        task("flood", "flood", str(FLOOD_MB)),
        task("exit3", "exit", "3"),
        task("segv", "signal", "SEGV"),
        task("sigkill", "signal", "KILL"),
        task("hang", "hang", timeout="1s"),
        task("escape-exit", "escape", str(pids["escape-exit"]), "exit"),
        task("escape-hang", "escape", str(pids["escape-hang"]), "hang", timeout="1s"),
        task("flaky", "flaky", max_attempts=2),
        {"name": "notfound", "command": [str(tmp_path / "no-such-program")]},
    ]
    rng = random.Random(seed)
    rng.shuffle(tasks)
    slots = rng.randint(2, 4)
    print(f"seed={seed}: order {[t['name'] for t in tasks]} on sim:{slots}")
    top = {
        "name": "faults",
        "workspace": "ws",
        "gpus": f"sim:{slots}",
        "grace": "0.5s",
        "defaults": {"env": {"CHAOS_SHARED": str(shared)}},
        "reliability": {
            "retry_backoff": "0.2s",
            "breaker": {"failures": 0},
            "max_log_mb": MAX_LOG_MB,
        },
    }
    config = write_config(tmp_path, top, tasks)
    proc = cli_popen("run", "-q", config)
    run_dir = wait_for_run(tmp_path / "ws")
    flood_log = run_dir / "tasks/flood/attempt-1/output.log"
    with Sampler(proc.pid, lambda: flood_log if flood_log.exists() else None) as sampler:
        res = proc.wait(60)
    assert res.returncode == 1, str(res)

    ids = [t["name"] for t in tasks]
    rep = check_run(run_dir, ids, shared=shared)
    expected = {
        "ok": "done",
        "flood": "done",
        "escape-exit": "done",
        "flaky": "done",
        "exit3": "failed",
        "segv": "failed",
        "sigkill": "failed",
        "hang": "failed",
        "escape-hang": "failed",
        "notfound": "failed",
    }
    assert rep.states == expected
    d = rep.descriptors
    last = {tid: d[tid]["attempts"][-1] for tid in ids}
    assert last["exit3"]["kind"] == "exited" and last["exit3"]["returncode"] == 3
    assert last["segv"]["kind"] == "signaled" and last["segv"]["signal"] == "SIGSEGV"
    assert last["sigkill"]["kind"] == "signaled" and last["sigkill"]["signal"] == "SIGKILL"
    for tid in ("hang", "escape-hang"):
        assert last[tid]["kind"] == "timeout", last[tid]
        assert last[tid]["duration"] < 10, last[tid]  # TERM ignored: KILLed after the grace
    assert last["notfound"]["kind"] == "not-found", last["notfound"]
    assert [a["returncode"] for a in d["flaky"]["attempts"]] == [1, 0]
    for tid in ("exit3", "segv", "sigkill", "hang", "escape-hang", "notfound"):
        assert d[tid]["reason"], (tid, d[tid])

    # escapees (double fork + setsid, SIGTERM ignored) die with their attempt
    for name, pidfile in pids.items():
        pid = int(wait_for(pidfile.read_text, 5, what=f"{pidfile}"))
        wait_for(partial(_gone, pid), 10, what=f"escapee of {name} to die")

    # the flood: log bounded once the attempt ended, supervisor memory flat
    cap = MAX_LOG_MB << 20
    size = flood_log.stat().st_size
    assert size <= cap, f"log of the flood is {size} bytes, cap {cap}"
    assert sampler.log_peak <= cap, f"the flood's log reached {sampler.log_peak} bytes"
    assert b"bytes of output dropped here" in flood_log.read_bytes()
    peak_rss = max(sampler.rss)
    print(
        f"flood: {FLOOD_MB} MiB written, log {size} bytes at the end, peak seen by the "
        f"sampler {sampler.log_peak >> 20} MiB; supervisor RSS {sampler.rss[0] >> 20}.."
        f"{peak_rss >> 20} MiB over {len(sampler.rss)} samples"
    )
    assert len(sampler.rss) >= 5, "the supervisor was not sampled during the run"
    assert peak_rss < RSS_LIMIT, f"supervisor RSS peaked at {peak_rss >> 20} MiB"
    assert peak_rss - sampler.rss[0] < 64 << 20, "supervisor RSS grew during the flood"
    figures(
        "4 task faults in one run",
        tasks=len(ids),
        faults=9,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
        log_end_kib=size >> 10,
        rss_peak_mib=peak_rss >> 20,
    )


def test_flood_log_never_exceeds_its_cap_while_written(
    tmp_path: Path, cli: Callable[..., CliResult]
) -> None:
    top = {"name": "flood", "workspace": "ws", "gpus": "sim:1", "reliability": {"max_log_mb": 1}}
    config = write_config(tmp_path, top, [task("flood", "flood", str(FLOOD_MB))])
    res = cli("run", "-q", config)
    assert res.returncode == 0, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    peak = int((run_dir / "tasks/flood/flood.peak").read_text())
    print(f"the log reached {peak} bytes while the task wrote {FLOOD_MB} MiB (cap 1 MiB)")
    assert 0 < peak <= 1 << 20, f"the log reached {peak} bytes (max_log_mb: 1)"
    log = run_dir / "tasks/flood/attempt-1/output.log"
    assert log.stat().st_size <= 1 << 20
    assert b"bytes of output dropped here" in log.read_bytes()


@pytest.mark.trials(1)
def test_breaker_quarantines_slots_whose_attempts_keep_failing(
    tmp_path: Path, cli: Callable[..., CliResult], figures: Callable[..., None], seed: int
) -> None:
    n, failures = random.Random(seed).randint(7, 14), 3
    print(f"seed={seed}: {n} failing tasks")
    top = {
        "name": "breaker",
        "workspace": "ws",
        "gpus": "sim:2",
        "reliability": {"retry_backoff": None, "breaker": {"failures": failures, "window": "60s"}},
    }
    tasks = [task(f"t{i}", "exit", "1") for i in range(n)]
    config = write_config(tmp_path, top, tasks)
    res = cli("run", "-q", "--json", config)
    assert res.returncode == 1, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    rep = check_run(run_dir, [t["name"] for t in tasks])
    counts = rep.counts()
    # every task fails on every slot: the tasks' fault, not a GPU's (issue 11), so the breaker
    # blames no slot and every task runs (and fails)
    assert counts == {"failed": n}, counts
    assert summary(run_dir)["quarantined"] == []
    assert not [e for e in read_events(run_dir) if e["ev"] == "quarantined"]
    figures(
        "4b breaker (failures 3) on sim:2",
        tasks=n,
        faults=n,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
    )
