"""7. Queue control (issue 17): cancel and add on a live run; claims beside control files.

(a) cancel latency: ``gpuswarm run -q --no-report --gpus sim:2`` over 45 tasks ``sleep 1000.K``
    runs in the background. 20 times (5 with --quick): once both slots run a task, and after a
    random delay of 0-1 s (the keeper's tick is once a second: a person cancels at any point of
    it), one of them is cancelled with ``gpuswarm cancel RUN TASK`` (the real CLI); the clock
    starts just before that command is launched and stops when the task's descriptor is in
    ``cancelled/`` and its ``sleep`` process is gone (polled every 10 ms). The journal's
    ``control`` event (the supervisor applying the request) and the CLI's own exit are timed
    from the same start. Interleaved with those, 20 more with ``gpuswarm cancel RUN TASK
    --wait``, whose target is its own wall time (it returns once the task has left running/).
    Median and p90.
(b) add to a live run: ``gpuswarm run`` on ``sim:2`` busy with 2 tasks ``sleep 1000`` (2 more
    pending); ``gpuswarm add RUN cmds.txt`` of 10,000 command lines (``true K``), wall of the CLI
    (median of 3 with fresh live runs: each add is 10k more descriptors). Beside it: the CLI's
    start-up floor (``python -m gpuswarm --version``, median of 3), the disk's floor (creating
    10,000 small files alone, :func:`create_floor`), and the in-process time of
    ``control_ops.add_tasks`` on another live run (the list already loaded; loading and
    validating it, ``control_ops.load_source``, on its own).
(c) claims with control files: a run whose first supervisor B (``sim:1``) holds one task
    ``sleep 1000`` and is then stopped with SIGSTOP (alive, so its lease stands: nobody applies a
    cancel of its task); 2,000 tasks ``true`` are added and a second supervisor A,
    ``gpuswarm work RUN --gpus sim:8 -q --no-report``, runs them. Either with nothing in
    ``.parallel/control/``, or with 1,000 cancel requests of B's task (``store.control.put``,
    the CLI's path) and a pause flag for B's slot: A's keeper reads all of them on every tick
    and leaves them (the task is B's). A's in-run rate (first ``started`` to last ``finished``
    event), median of 5 runs of each case (1 with --quick), alternating, is compared: the target
    is the same rate (ratio ~1.0). Beside it, in-process: one
    claim (``DirQueue.claim``, median of 500 after the first) on a fresh 1,000-task run with 0
    vs 1,000 request files and a pause flag, and the keeper's read of those files per tick
    (``store.control.requests`` + ``store.control.paused``, median of 20).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil
from common import (
    GPUSWARM,
    Config,
    EventTail,
    Row,
    env_for_bench,
    failed,
    kill_tree,
    median,
    percentile,
    say,
    stop_tree,
    the_run,
    timed,
    wait_for,
)

BENCH = "7 queue control"
CANCEL_TARGET = 1.5  # s, median of 20
ADD_TARGET = 2.0  # s, 10,000 tasks


Times = list[dict[str, float]]


# -- a live run in the background -------------------------------------------------------------
class LiveRun:
    """``gpuswarm run -q --no-report --gpus sim:N`` over ``lines``, in the background."""

    def __init__(self, work: Path, lines: list[str], gpus: int, argv: list[str] | None = None):
        work.mkdir(parents=True, exist_ok=True)
        self.ws = work / "ws"
        cmds = work / "cmds.txt"
        cmds.write_text("".join(f"{line}\n" for line in lines))
        base = argv or [*GPUSWARM, "run", "-q", "--no-report", "--gpus", f"sim:{gpus}"]
        self.log = (work / "run.log").open("ab")
        self.proc = subprocess.Popen(
            [*base, "--workspace", str(self.ws), str(cmds)],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            env=env_for_bench(),
        )
        if not wait_for(lambda: the_run(self.ws) is not None or self.proc.poll() is not None, 120):
            raise RuntimeError("no run folder after 120 s")
        run_dir = the_run(self.ws)
        if run_dir is None:
            raise RuntimeError(f"gpuswarm exited {self.proc.returncode} without a run folder")
        self.run_dir = run_dir
        self.running_dir = run_dir / ".parallel" / "running"
        self.cancelled_dir = run_dir / ".parallel" / "cancelled"

    def running(self) -> list[str]:
        from gpuswarm.store.names import task_id_of

        try:
            return sorted(task_id_of(n) for n in os.listdir(self.running_dir))
        except FileNotFoundError:
            return []

    def wait_running(self, count: int, timeout: float = 60.0) -> list[str]:
        enough = lambda: len(self.running()) >= count or self.proc.poll() is not None  # noqa: E731
        if not wait_for(enough, timeout):
            raise RuntimeError(f"fewer than {count} tasks running after {timeout:.0f} s")
        if self.proc.poll() is not None:
            raise RuntimeError(f"gpuswarm exited {self.proc.returncode}")
        return self.running()

    def stop(self) -> None:
        try:
            stop_tree(self.proc, signal.SIGINT, wait=60)
        finally:
            self.log.close()


def sleeps_of(pid: int) -> dict[str, psutil.Process]:
    """The ``sleep`` processes under ``pid``, by their argument."""
    out = {}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmd = child.cmdline()
                if cmd[:1] == ["sleep"] and len(cmd) == 2:
                    out[cmd[1]] = child
    return out


def gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def in_folder(folder: Path, task: str) -> bool:
    from gpuswarm.store.names import task_id_of

    try:
        return any(task_id_of(n) == task for n in os.listdir(folder))
    except FileNotFoundError:
        return False


# -- (a) cancel --------------------------------------------------------------------------------
def run(cfg: Config) -> list[Row]:
    rows: list[Row] = []
    for name, part in (("cancel", _cancel), ("add", _add), ("claims", _claims)):
        say(f"queue control: {name}")
        try:
            rows += part(cfg)
        except Exception as exc:  # one part's harness bug must not lose the others
            rows.append(failed(BENCH, f"{name}: the whole part", "gpuswarm", exc))
    return rows


def _cancel(cfg: Config) -> list[Row]:
    times = cfg.control_cancels
    lines = [f"sleep 1000.{k}" for k in range(1, 2 * times + 6)]
    live = LiveRun(cfg.work / "control" / "cancel", lines, 2)
    rng = random.Random(17)
    try:
        plain: Times = []
        waited: Times = []
        for _ in range(times):  # interleaved: a change of the machine's load hits both alike
            plain.append(_cancel_once(live, rng.uniform(0, 1), wait=False))
            waited.append(_cancel_once(live, rng.uniform(0, 1), wait=True))
    finally:
        live.stop()
    return _cancel_rows(plain, waited, times)


def _cancel_once(live: LiveRun, phase: float, *, wait: bool) -> dict[str, float]:
    """Cancel one running task, ``phase`` seconds after both slots run one; seconds from the
    command's launch to: its exit, the journal's ``control`` event, the task in cancelled/ with
    its process gone.

    The supervisor applies requests on its keeper's tick, once a second, and the previous cancel
    was applied on a tick, after which the next task started at once: without the random delay,
    every command would be launched at the same point of the tick's cycle (measuring one phase,
    not what a person cancelling at any moment sees)."""
    tasks = live.wait_running(2)
    time.sleep(phase)
    task = tasks[0]
    line = int(task.rsplit("-", 1)[1])
    sleeps = sleeps_of(live.proc.pid)
    proc = sleeps.get(f"1000.{line}")
    if proc is None:
        # its attempt is being started: wait for its process
        wait_for(lambda: f"1000.{line}" in sleeps_of(live.proc.pid), 10)
        proc = sleeps_of(live.proc.pid).get(f"1000.{line}")
        if proc is None:
            raise RuntimeError(f"no process for running task {task} (sleep 1000.{line})")
    follower = EventTail(live.run_dir / "events.jsonl", from_end=True)
    argv = [*GPUSWARM, "cancel", str(live.run_dir), task, *(["--wait"] if wait else [])]
    t0 = time.time()
    cli = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env_for_bench(),
    )
    cli_end = applied = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = time.time()
        if cli_end is None and cli.poll() is not None:
            cli_end = now
        for ev in follower.poll():
            if ev.get("ev") == "control" and ev.get("task") == task and applied is None:
                applied = float(ev["ts"])
        if gone(proc) and in_folder(live.cancelled_dir, task):
            done = now
            break
        time.sleep(0.01)
    else:
        raise RuntimeError(f"task {task} not cancelled within 60 s")
    _, err = cli.communicate(timeout=60)
    cli_end = cli_end or time.time()
    if cli.returncode != 0:
        raise RuntimeError(f"gpuswarm cancel exited {cli.returncode}: {err.decode()[-300:]}")
    for ev in follower.poll():
        if ev.get("ev") == "control" and ev.get("task") == task and applied is None:
            applied = float(ev["ts"])
    return {
        "cli": cli_end - t0,
        "applied": (applied - t0) if applied is not None else float("nan"),
        "done": done - t0,
    }


def _stats(values: list[float]) -> tuple[float, float]:
    return median(values), percentile(values, 90)


def _cancel_rows(plain: Times, waited: Times, n: int) -> list[Row]:
    med, p90 = _stats([r["done"] for r in plain])
    cli_med, cli_p90 = _stats([r["cli"] for r in plain])
    app_med, app_p90 = _stats([r["applied"] for r in plain])
    w_med, w_p90 = _stats([r["cli"] for r in waited])
    wd_med, _ = _stats([r["done"] for r in waited])
    size = f"running task on a live run (sim:2, sleeping tasks), {n} times"
    return [
        Row(
            BENCH,
            f"`gpuswarm cancel RUN TASK` -> task in cancelled/, its process gone: {size}, "
            "median / p90 s",
            "gpuswarm",
            med,
            "s",
            f"median <= {CANCEL_TARGET} s",
            med <= CANCEL_TARGET,
            shown=f"{med:.2f} / {p90:.2f}",
            note=f"the CLI returned (request recorded) after {cli_med:.2f} / {cli_p90:.2f} s; "
            f"the supervisor journaled `control` (applied) at {app_med:.2f} / {app_p90:.2f} s",
            extra={"runs": plain},
        ),
        Row(
            BENCH,
            f"`gpuswarm cancel RUN TASK --wait`, wall of the CLI: {size}, median / p90 s",
            "gpuswarm",
            w_med,
            "s",
            f"median <= {CANCEL_TARGET} s",
            w_med <= CANCEL_TARGET,
            shown=f"{w_med:.2f} / {w_p90:.2f}",
            note=f"task in cancelled/ with its process gone at {wd_med:.2f} s (median)",
            extra={"runs": waited},
        ),
    ]


# -- (b) add -----------------------------------------------------------------------------------
def _busy_run(work: Path) -> LiveRun:
    live = LiveRun(work, ["sleep 1000"] * 4, 2)
    live.wait_running(2)
    return live


def create_floor(folder: Path, n: int) -> float:
    """Seconds to create ``n`` files of 200 bytes in a fresh folder (``O_CREAT | O_EXCL``, no
    fsync), as an add creates its descriptors: the disk's share of an add. On this VM's ext4
    without a journal it is 20-30 us a file on a quiet disk and up to ~0.7 ms right after mass
    deletions (see BENCHMARKS.md, "The disk of this machine")."""
    folder.mkdir(parents=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    body = b"x" * 200
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(folder / f"f{i}.json", flags, 0o644)
        os.write(fd, body)
        os.close(fd)
    return time.perf_counter() - t0


def _add(cfg: Config) -> list[Row]:
    from gpuswarm.app.adding import load_source
    from gpuswarm.app.control import add_tasks
    from gpuswarm.config.models import TaskOptions

    n = cfg.control_add
    repeats = 1 if cfg.quick else 3
    work = cfg.work / "control" / "add"
    work.mkdir(parents=True, exist_ok=True)
    cmds = work / "add.txt"
    cmds.write_text("".join(f"true {k}\n" for k in range(n)))
    floor = median([timed([*GPUSWARM, "--version"]) for _ in range(3)])
    creates = create_floor(work / "floor", n)
    walls: list[float] = []
    for i in range(repeats):
        live = _busy_run(work / f"cli-{i}")
        try:
            os.sync()
            walls.append(timed([*GPUSWARM, "add", str(live.run_dir), str(cmds)]))
            pending = len(os.listdir(live.run_dir / ".parallel" / "pending"))
            if pending < n:
                raise RuntimeError(f"{pending} tasks pending after adding {n}")
            if live.proc.poll() is not None:
                raise RuntimeError("the run ended during the add")
        finally:
            live.stop()
    live = _busy_run(work / "api")
    try:
        os.sync()
        t0 = time.perf_counter()
        loaded = load_source(str(cmds), shell=False, defaults=TaskOptions())
        t1 = time.perf_counter()
        result = add_tasks(live.run_dir, loaded)
        t2 = time.perf_counter()
        if result["added"] != n or not result["live"]:
            raise RuntimeError(f"add_tasks: {result['added']} added, live {result['live']}")
    finally:
        live.stop()
    wall = median(walls)
    size = f"{n:,} command lines to a live run (sim:2, 2 tasks running)"
    return [
        Row(
            BENCH,
            f"`gpuswarm add RUN cmds.txt`, {size}: CLI wall, s (median of {repeats})",
            "gpuswarm",
            wall,
            "s",
            f"< {ADD_TARGET:g} s",
            wall < ADD_TARGET,
            note=f"start-up floor (`python -m gpuswarm --version`) {floor:.2f} s; creating "
            f"{n:,} small files alone on this disk now {creates:.2f} s; walls "
            f"{', '.join(f'{w:.2f}' for w in walls)}",
            extra={"walls": walls, "floor_s": floor, "create_floor_s": creates},
        ),
        Row(
            BENCH,
            f"`control_ops.add_tasks`, {size}, in-process, s",
            "gpuswarm",
            t2 - t1,
            "s",
            note=f"loading + validating the list (`load_source`) {t1 - t0:.2f} s on its own",
            extra={"load_s": t1 - t0},
        ),
    ]


# -- (c) claims with control files present -----------------------------------------------------
def _claims(cfg: Config) -> list[Row]:
    n, k = cfg.throughput_tasks, cfg.control_requests
    repeats = cfg.control_repeats
    work = cfg.work / "control" / "claims"
    rates: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    tick: list[float] = []
    for i in range(repeats):
        for with_files in (False, True) if i % 2 == 0 else (True, False):
            got = _two_supervisors(work / f"{i}-{int(with_files)}", n, k if with_files else 0)
            rates[with_files].append(got["rate"])
            tick += got["tick"]
    rows = []
    base = median([r for r, _ in rates[False]])
    loaded = median([r for r, _ in rates[True]])
    ratio = loaded / base
    size = f"{n:,} x `true` on a second supervisor (sim:8) of a live run"
    rows.append(
        Row(
            BENCH,
            f"{size}: in-run tasks/s, {k:,} control requests + a pause flag vs none "
            f"(median of {repeats})",
            "gpuswarm",
            loaded,
            "tasks/s",
            "~1.0x (>= 0.95x)",
            ratio >= 0.95,
            ratio=f"{ratio:.2f}x the rate with none",
            shown=f"{loaded:,.0f} vs {base:,.0f}",
            note=f"wall (launch of `gpuswarm work` to its last finish) "
            f"{median([w for _, w in rates[True]]):.2f} vs "
            f"{median([w for _, w in rates[False]]):.2f} s; the keeper reads the "
            f"{k:,} files once a tick: {median(tick) * 1e3:.1f} ms (median of 20)",
            extra={"with": rates[True], "without": rates[False], "tick_s": tick},
        )
    )
    rows.append(_claim_cost(cfg, work / "api"))
    return rows


def _with_control_files(paths: Any, task: str, slot: str, count: int) -> None:
    from gpuswarm.store import control

    for _ in range(count):
        control.put(paths, "cancel", task, "bench")
    control.pause(paths, slot)


def _two_supervisors(work: Path, n: int, requests: int) -> dict[str, Any]:
    """B holds one sleeping task and is stopped; A runs ``n`` added tasks ``true``."""
    from gpuswarm.app.adding import load_source
    from gpuswarm.app.control import add_tasks
    from gpuswarm.config.models import TaskOptions
    from gpuswarm.store import control
    from gpuswarm.store.leases import registered_slot_ids
    from gpuswarm.store.runs import open_run

    b = LiveRun(work, ["sleep 1000"], 1)
    a: subprocess.Popen[bytes] | None = None
    tree: list[psutil.Process] = []
    try:
        (held,) = b.wait_running(1)
        wait_for(lambda: bool(sleeps_of(b.proc.pid)), 10)
        tree = list(sleeps_of(b.proc.pid).values())  # killed at the end even if B lost them
        b.proc.send_signal(signal.SIGSTOP)
        paths, _ = open_run(b.run_dir)
        b_slots = registered_slot_ids(paths)
        with_files = requests > 0
        if with_files:
            _with_control_files(paths, held, b_slots[0], requests)
        cmds = work / "more.txt"
        cmds.write_text("true\n" * n)
        add_tasks(b.run_dir, load_source(str(cmds), shell=False, defaults=TaskOptions()))
        os.sync()
        follower = EventTail(b.run_dir / "events.jsonl", from_end=True)
        argv = [*GPUSWARM, "work", str(b.run_dir), "--gpus", "sim:8", "-q", "--no-report"]
        launched = time.time()
        a = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=b.log, stderr=b.log, env=env_for_bench()
        )
        starts, ends = _follow(follower, a, n)
        left = len(control.requests(paths))
        if left != requests:
            raise RuntimeError(f"{left} of {requests} control requests left: some were applied")
        a_slots = set(registered_slot_ids(paths)) - set(b_slots)
        if with_files and (b_slots[0] in a_slots or not a_slots):
            raise RuntimeError(f"the paused slot {b_slots[0]} is one of A's: {sorted(a_slots)}")
        tick = _tick_cost(paths) if with_files else []
        return {
            "rate": (n / (max(ends) - min(starts)), max(ends) - launched),
            "tick": tick,
        }
    finally:
        if a is not None:
            stop_tree(a, signal.SIGINT, wait=60)
        with contextlib.suppress(ProcessLookupError):
            b.proc.send_signal(signal.SIGCONT)
        kill_tree(b.proc.pid)
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        b.proc.wait()
        b.log.close()


def _follow(follower: EventTail, a: subprocess.Popen[bytes], n: int) -> tuple[list[float], ...]:
    """The ``started`` and ``finished`` times until ``n`` tasks finished."""
    starts: list[float] = []
    ends: list[float] = []
    deadline = time.monotonic() + 600
    while len(ends) < n and time.monotonic() < deadline and a.poll() is None:
        for ev in follower.poll():
            if ev.get("ev") == "started":
                starts.append(float(ev["ts"]))
            elif ev.get("ev") == "finished":
                ends.append(float(ev["ts"]))
        time.sleep(0.02)
    ends += [float(ev["ts"]) for ev in follower.poll() if ev.get("ev") == "finished"]
    if len(ends) < n:
        raise RuntimeError(f"supervisor A finished {len(ends)} of {n} tasks")
    return starts, ends


def _tick_cost(paths: Any) -> list[float]:
    """Seconds of the keeper's reads of the control folder (requests, pause flags), 20 times."""
    from gpuswarm.store import control

    out = []
    for _ in range(20):
        t = time.perf_counter()
        control.requests(paths)
        control.paused(paths)
        out.append(time.perf_counter() - t)
    return out


def _claim_cost(cfg: Config, work: Path) -> Row:
    from scale import api_run, claim_cost

    from gpuswarm.store import control

    k, r = cfg.scale_small, cfg.control_requests
    metric = (
        f"one claim (`DirQueue.claim`), {k:,} pending, with {r:,} control requests + a "
        f"pause flag vs none (median of {cfg.claims}), us"
    )
    try:
        plain, _, _ = api_run(k, work / "plain")
        loaded, _, _ = api_run(k, work / "files")
        for _ in range(r):
            control.put(loaded, "cancel", "cmd-00001", "bench")
        control.pause(loaded, "elsewhere-gpu0")
        _, cost_plain = claim_cost(plain, cfg.claims)
        _, cost_files = claim_cost(loaded, cfg.claims)
    except Exception as exc:
        return failed(BENCH, metric, "gpuswarm", exc)
    ratio = cost_files / cost_plain
    return Row(
        BENCH,
        metric,
        "gpuswarm",
        cost_files * 1e6,
        "us",
        ratio=f"{ratio:.2f}x the cost with none",
        shown=f"{cost_files * 1e6:.0f} vs {cost_plain * 1e6:.0f}",
        note="the claim itself never reads the control folder (the keeper does, once a tick)",
        extra={"us_plain": cost_plain * 1e6},
    )
