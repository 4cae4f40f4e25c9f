"""Variants as tasks of a core run, and the background runner that supervises that run.

A variant is exported (its commit's tree, plus symlinks to the untracked paths the experiment
links, such as ``.venv``) into ``variants/<id>/`` and queued as a task of the experiment's core
run, with that folder as its working directory. The runner is ``gpuswarm research _serve``: a
detached process holding ``serve.lock`` that supervises the run (one slot per GPU, timeouts that
kill process trees, crash recovery) and lingers a while when idle. Whoever queues a variant
makes sure a runner is alive; the runner, before it ends, gives the lock back and looks again,
so a variant queued at that moment is never left without one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from gpuswarm import __version__
from gpuswarm.config.load import TaskSpec
from gpuswarm.core.errors import ResearchError
from gpuswarm.core.fsutil import temp_writer_alive
from gpuswarm.core.logs import log_tail
from gpuswarm.core.paths import RunPaths
from gpuswarm.engine import Output, setup_from_info, supervise
from gpuswarm.exec.local.process import find_by_env, kill_tree
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.research import gitops
from gpuswarm.research.experiment import (
    ExperimentConfig,
    ExpPaths,
    Variant,
    file_sha256,
    flocked,
)
from gpuswarm.store.queue import (
    DirQueue,
    State,
    base_name,
    task_id_of,
)
from gpuswarm.store.reader import RunReader
from gpuswarm.store.runs import NewRun, create_run, open_run

EXPERIMENT_VAR = "GPUSWARM_EXPERIMENT"
SUMMARY_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*):\s+([-+]?[0-9.]+(?:[eE][-+]?\d+)?)\s*$")


def create_queue(paths: ExpPaths, cfg: ExperimentConfig) -> str:
    """Create the experiment's core run (no tasks yet); returns its folder relative to root."""
    gpus = parse_gpu_spec(cfg.gpus)
    slots = plan_slots(gpus, 1, 1)
    info: dict[str, Any] = {
        "gpuswarm": __version__,
        "name": f"research-{cfg.tag}",
        "workspace": str(paths.root),
        "source": "research",
        "base_dir": str(paths.repo),
        "fingerprint": "",
        "gpus": gpus.spec,
        "vendor": gpus.vendor.value,
        "gpu_ids": list(gpus.ids),
        "gpus_per_task": 1,
        "tasks_per_gpu": 1,
        "slot_count": len(slots),
        "home": {"isolate": False, "provision": []},
        # crashes are results here, not a sick GPU: no circuit breaker, no retries
        "settings": {
            "lease_ttl": 30.0,
            "retry_backoff": 0.0,
            "breaker_failures": 0,
            "breaker_window": 60.0,
            "max_log_bytes": 64 << 20,
            "linger": cfg.linger,
        },
        "config": {"research": cfg.tag},
        "task_count": 0,
        "hosts": [socket.gethostname()],
    }
    run = create_run(NewRun(name="queue", workspace=paths.root, info=info, tasks=[]))
    return str(run.root.relative_to(paths.root))


def run_paths(paths: ExpPaths, cfg: ExperimentConfig) -> RunPaths:
    return RunPaths(paths.root / cfg.run)


def slot_count(paths: ExpPaths, cfg: ExperimentConfig) -> int:
    _, info = open_run(run_paths(paths, cfg).root)
    return int(info.get("slot_count", 1))


# -- queueing ----------------------------------------------------------------------------------
def export(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> Path:
    """The variant's tree in its own folder (re-made from scratch: a crash may have cut it)."""
    dest = paths.export_dir(v.id)
    if dest.exists():
        remove_export(paths, v.id)
    paths.variants.mkdir(exist_ok=True)
    tmp = paths.variants / f".{v.id}.partial"
    remove_tree(tmp)
    gitops.export(paths.repo, v.commit, tmp)
    for rel in cfg.link:
        src = paths.repo / rel
        if src.exists() and not (tmp / rel).exists():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).symlink_to(src)
    os.rename(tmp, dest)
    return dest


def remove_tree(path: Path) -> None:
    """Remove an export; it may hold read-only folders a training run created."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            with contextlib.suppress(OSError):
                (Path(root) / d).chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)


def remove_export(paths: ExpPaths, variant_id: str) -> None:
    remove_tree(paths.export_dir(variant_id))


def task_for(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> TaskSpec:
    command: list[str] | str = cfg.command if cfg.shell else shlex.split(cfg.command)
    return TaskSpec(
        id=v.id,
        name=v.description[:60] or v.id,
        command=command,
        shell=cfg.shell,
        cwd=str(paths.export_dir(v.id)),
        env={"GPUSWARM_VARIANT": v.id, "GPUSWARM_COMMIT": v.commit},
        timeout=cfg.timeout,
        grace=10.0,
        max_attempts=1,
        priority=10 if v.kind == "baseline" else 0,
        metrics={cfg.metric: cfg.metric_pattern, "peak_vram_mb": cfg.memory_pattern},
    )


def enqueue(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> None:
    """Export a variant that has no task yet and put its task in pending/ (durably)."""
    export(paths, cfg, v)
    changed = _protected_changes(paths, cfg, v)  # checked before the run, and after it
    if changed:
        remove_export(paths, v.id)
        raise ResearchError(f"{v.id} changes protected file(s) {', '.join(changed)}")
    run = run_paths(paths, cfg)
    task = task_for(paths, cfg, v)
    seq = int(v.id[1:])
    DirQueue.add_pending(run, task.model_dump(), seq)  # touches the marker live runners watch


def withdraw(paths: ExpPaths, cfg: ExperimentConfig, variant_id: str) -> bool:
    """Take a variant's task out of pending/ before a runner claims it; False when it is not
    there (claimed meanwhile, or never queued). A claim and this rename cannot both win."""
    return DirQueue(run_paths(paths, cfg)).withdraw(variant_id)


def remove_cut_writes(paths: ExpPaths, cfg: ExperimentConfig) -> int:
    """Temp files in the queue's pending/ whose writer is dead: writes a crash cut short (the
    runner may be re-queueing an attempt right now). Returns how many went."""
    pending = run_paths(paths, cfg).state_dir("pending")
    cut = [
        pending / n
        for n in os.listdir(pending)
        if n.startswith(".tmp-") and not temp_writer_alive(n)
    ]
    for path in cut:
        path.unlink(missing_ok=True)
    return len(cut)


def tasks(paths: ExpPaths, cfg: ExperimentConfig) -> dict[str, tuple[State, str]]:
    """Variant id -> the state folder and file name of its task (one look at each folder)."""
    run = run_paths(paths, cfg)
    out: dict[str, tuple[State, str]] = {}
    for state in (State.PENDING, State.RUNNING, State.FAILED, State.DONE):
        for name in os.listdir(run.state_dir(state.value)):
            if not name.startswith("."):
                out[task_id_of(base_name(name))] = (state, name)
    return out


def finished_ids(paths: ExpPaths, cfg: ExperimentConfig) -> set[str]:
    run = run_paths(paths, cfg)
    out: set[str] = set()
    for state in (State.DONE, State.FAILED):
        out.update(
            task_id_of(n) for n in os.listdir(run.state_dir(state.value)) if not n.startswith(".")
        )
    return out


def running(paths: ExpPaths, cfg: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """Variant id -> {slot, since} for the tasks in running/ (claim time = file mtime)."""
    reader = RunReader(run_paths(paths, cfg))
    return {r.task: {"slot": r.slot or "?", "since": r.since} for r in reader.running()}


# -- results -----------------------------------------------------------------------------------
def summary_fields(log: Path, max_bytes: int = 65536) -> dict[str, float]:
    """``key: number`` lines of the log's tail (the training script's summary block)."""
    text = log_tail(log, max_lines=400, max_bytes=max_bytes)
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = SUMMARY_LINE.match(line)
        if m:
            with contextlib.suppress(ValueError):
                out[m.group(1)] = float(m.group(2))
    return out


def outcome(
    paths: ExpPaths, cfg: ExperimentConfig, v: Variant, found: tuple[State, str]
) -> dict[str, Any] | None:
    """What a variant's task (``found`` by :func:`tasks`) produced; None while unfinished."""
    state, name = found
    if state not in (State.DONE, State.FAILED):
        return None
    run = run_paths(paths, cfg)
    data = DirQueue(run).read(state, name) or {"attempts": []}
    attempts = [a for a in data.get("attempts", []) if not a.get("interrupted")]
    last = attempts[-1] if attempts else {}
    n = int(last.get("n", 0))
    log = run.attempt_log(v.id, n) if n else None
    metrics = last.get("metrics") or {}
    metric = metrics.get(cfg.metric)
    memory = metrics.get("peak_vram_mb")
    text = log_tail(log, max_lines=400, max_bytes=1 << 20) if log else ""
    reason = _crash_reason(cfg, state, last, metric, text)
    protect = _protected_changes(paths, cfg, v) + protected_data_changes(paths, cfg)
    if reason is None and protect:
        reason = f"changed protected file {', '.join(protect)}"
    gpus = last.get("gpus") or []
    return {
        "ok": reason is None,
        "metric": float(metric) if reason is None and metric is not None else None,
        "memory_gb": round(float(memory) / 1024, 1) if isinstance(memory, int | float) else None,
        "reason": reason,
        "summary": summary_fields(log) if log else {},
        "gpu": ",".join(str(g) for g in gpus),
        "slot": last.get("slot"),
        "host": socket.gethostname(),
        "started": last.get("started"),
        "ended": last.get("ended"),
        "seconds": last.get("duration"),
        "exit": last.get("returncode"),
        "log": str(log.relative_to(paths.root)) if log else None,
        "log_path": str(log.resolve()) if log else None,
        "tail": "\n".join(text.splitlines()[-15:]) if reason else "",
    }


def _crash_reason(
    cfg: ExperimentConfig, state: State, last: dict[str, Any], metric: Any, text: str
) -> str | None:
    if last.get("oom"):
        return "OOM"
    kind = last.get("kind")
    if kind == "timeout":
        return f"timeout after {cfg.timeout:g}s"
    if state is State.FAILED:
        reason = str(last.get("reason") or "failed")
        line = failing_line(text)
        if not line and "SIGKILL" in reason:
            line = "killed from outside, e.g. by the kernel when memory ran out"
        return f"{reason}: {line}" if line else reason
    if re.search(cfg.fail_pattern, text, re.MULTILINE):
        return "FAIL"
    if not isinstance(metric, int | float) or metric != metric:  # missing or NaN
        return f"no {cfg.metric} in the output"
    return None


_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b.*$"
    r"|^Killed\b.*$|^Segmentation fault.*$|^.*(?:[Oo]ut of memory|CUDA error).*$"
)


def failing_line(text: str, limit: int = 160) -> str:
    """The line of a crashed run's log that says why: its last exception line
    (``SyntaxError: invalid syntax``, ``MemoryError``), a kill or an out-of-memory message."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and _EXCEPTION_LINE.match(line):
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def _protected_changes(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> list[str]:
    """Protected files whose content in the export differs from BASE's (before or after)."""
    changed = []
    root = paths.export_dir(v.id)
    for rel in cfg.protect:
        if rel in cfg.protect_sums:
            continue  # untracked: checked by checksum after the run (protected_data_changes)
        want = gitops.blob(paths.repo, v.parent, rel)
        try:
            have: bytes | None = (root / rel).read_bytes()
        except OSError:
            have = None
        if want is None or have is None or _sha(want) != _sha(have):
            changed.append(rel)
    return changed


def protected_data_changes(paths: ExpPaths, cfg: ExperimentConfig) -> list[str]:
    """Protected untracked files (linked into every run) whose checksum is not the one
    recorded at init: a run wrote into the user's data."""
    changed = []
    for rel, want in cfg.protect_sums.items():
        try:
            have = file_sha256(paths.repo / rel)
        except OSError:
            have = ""
        if have != want:
            changed.append(rel)
    return changed


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the background runner ---------------------------------------------------------------------
_RUNNERS: list[subprocess.Popen[bytes]] = []


def ensure_runner(paths: ExpPaths, cfg: ExperimentConfig) -> bool:
    """Start the runner unless one holds serve.lock; True when one was started."""
    with flocked(paths.serve_lock, blocking=False) as free:
        if not free:
            return False
    env = {**os.environ, EXPERIMENT_VAR: str(paths.root)}
    env.pop("GPUSWARM_RUN_DIR", None)
    log = os.open(paths.daemon_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for proc in list(_RUNNERS):  # reap runners this process started that have ended
        if proc.poll() is not None:
            _RUNNERS.remove(proc)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuswarm", "research", "_serve", str(paths.root)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=paths.repo,
            start_new_session=True,
            close_fds=True,
        )
        _RUNNERS.append(proc)  # detached, but ours to reap when a long-lived caller outlives it
    finally:
        os.close(log)
    return True


class RunnerWatch:
    """Re-starts the runner when it is gone; gives up (with its log) when it keeps dying."""

    def __init__(self, paths: ExpPaths, cfg: ExperimentConfig, limit: int = 3) -> None:
        self.paths, self.cfg, self.limit = paths, cfg, limit
        self.starts = 0

    def progressed(self) -> None:
        self.starts = 0

    def check(self) -> None:
        if not ensure_runner(self.paths, self.cfg):
            return
        self.starts += 1
        if self.starts > self.limit:
            tail = log_tail(self.paths.daemon_log, max_lines=8)
            raise ResearchError(
                f"the background runner keeps stopping without running anything; its log "
                f"({self.paths.daemon_log}) ends with:\n{tail}"
            )


def serve(paths: ExpPaths, cfg: ExperimentConfig) -> int:
    """The runner's body: supervise the run until it stays idle for ``linger`` seconds."""
    os.environ.pop(EXPERIMENT_VAR, None)  # (/proc still shows it) tasks must not inherit it
    run = run_paths(paths, cfg)
    while True:
        with flocked(paths.serve_lock, blocking=False) as mine:
            if not mine:
                return 0  # another runner has it
            _, info = open_run(run.root)
            setup = setup_from_info(info, None)
            report = supervise(
                run,
                setup,
                mode="resume",
                output=Output(stream=sys.stderr, report=False),  # research writes its own
                retry_failed=False,
            )
            if report.interrupted:
                return report.exit_code
        # the lock is free: a variant queued before this look is ours, after it, its queuer's
        if not DirQueue(run).names(State.PENDING):
            return 0


def runner_pids(paths: ExpPaths) -> list[int]:
    """The runner process(es) of this experiment (found by their environment and argv)."""
    out = []
    for pid in find_by_env(EXPERIMENT_VAR, str(paths.root)):
        with contextlib.suppress(psutil.Error):
            if "_serve" in psutil.Process(pid).cmdline():
                out.append(pid)
    return out


def stop_runner(paths: ExpPaths, *, grace: float = 60.0) -> int:
    """A warm stop of the runner: running variants go back to the queue. Returns how many."""
    procs = []
    for pid in runner_pids(paths):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.terminate()
            procs.append(proc)
    _, alive = psutil.wait_procs(procs, timeout=grace)
    if alive:
        kill_tree([p.pid for p in alive], 0)
    return len(procs)
