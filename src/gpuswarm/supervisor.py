"""The supervisor: one process, one long-lived loop per GPU slot: claim -> launch -> finish.

A slot claims the next task the moment it is free (no rounds, no waiting for the slowest). The
first stop request (Ctrl-C / SIGTERM) is a warm shutdown: no more claims, running attempts are
stopped (SIGTERM, grace, SIGKILL) and handed back to pending/ as interrupted, not as failed
attempts. The second is cold: everything is SIGKILLed at once, then handed back the same way.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpuswarm.config import TaskSpec, render, render_command, render_cwd, render_env
from gpuswarm.gpus import Slot, isolation_env
from gpuswarm.leases import owner_file
from gpuswarm.ledger import Ev, Ledger
from gpuswarm.logs import cap_log
from gpuswarm.metrics import ResultFileError, flatten, load_result_file, parse_metrics
from gpuswarm.paths import RunPaths
from gpuswarm.process import (
    Attempt,
    AttemptEnd,
    EndKind,
    LaunchSpec,
    become_subreaper,
    sweep_orphans,
)
from gpuswarm.queue import Claimed, DirQueue, State, attempts_used, lease_of, task_id_of
from gpuswarm.runs import reclaim_dead
from gpuswarm.sandbox import Provision, prepare_home

HEARTBEAT_SECONDS = 5.0
IDLE_POLL_SECONDS = 2.0  # an idle supervisor re-checks a queue other supervisors still work on
MAX_BACKOFF_SECONDS = 600.0
FAST_TICK = 0.02  # the keeper's tick while some log grows past its cap
LINGER_POLL_SECONDS = 0.1  # a lingering idle supervisor looks for new tasks this often


@dataclass(frozen=True)
class SupervisorConfig:
    slots: list[Slot]
    base_dir: Path  # default cwd of tasks
    owner: str
    isolate_home: bool = False
    provisions: tuple[Provision, ...] = ()
    heartbeat: float = HEARTBEAT_SECONDS
    lease_ttl: float = 30.0  # a lease whose owner shows no heartbeat for this long is reclaimed
    retry_backoff: float = 1.0  # wait before attempt n+1: backoff * 2**(n-1), 0 = none
    breaker_failures: int = 5  # quarantine a slot whose last N attempts all failed ...
    breaker_window: float = 60.0  # ... within this many seconds; 0 failures = never
    max_log_bytes: int = 256 << 20  # each attempt's output.log is kept under this size
    linger: float = 0.0  # an idle supervisor waits this long for new tasks before it ends


@dataclass
class LiveAttempt:
    slot: Slot
    task_id: str
    name: str
    attempt: int
    started: float
    handle: Attempt


@dataclass
class Outcome:
    """What one attempt led to."""

    state: State
    reason: str
    record: dict[str, Any] = field(default_factory=dict)


class Supervisor:
    def __init__(self, paths: RunPaths, queue: DirQueue, ledger: Ledger, cfg: SupervisorConfig):
        self.paths = paths
        self.queue = queue
        self.ledger = ledger
        self.cfg = cfg
        self.stopping = threading.Event()
        self.cold = False
        self._cond = threading.Condition()
        self._in_flight = 0
        self._generation = 0
        self.live: dict[int, LiveAttempt] = {}
        self.errors: list[BaseException] = []
        self.quarantined: list[dict[str, Any]] = []
        self._delayed: list[tuple[float, int, Claimed]] = []  # retries waiting for their backoff
        self._delay_seq = 0
        self._done_keeping = threading.Event()
        self._log_sizes: dict[Path, int] = {}
        self._reclaimer: threading.Thread | None = None
        self._busy_at = time.monotonic()  # last claim or release (the linger counts from it)

    # -- top level -----------------------------------------------------------------------------
    def run(self) -> None:
        """Run every slot until the queue is drained or a stop is requested."""
        become_subreaper()
        labels = [s.label for s in self.cfg.slots]
        self.ledger.emit(Ev.SUPERVISOR_STARTED, owner=self.cfg.owner, slots=labels, pid=os.getpid())
        threads = [
            threading.Thread(target=self._slot_main, args=(s,), name=f"slot-{s.label}", daemon=True)
            for s in self.cfg.slots
        ]
        keeper = threading.Thread(target=self._keep, name="keeper", daemon=True)
        keeper.start()
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)  # wakes for signal handlers in the main thread
        self._done_keeping.set()
        keeper.join()
        if self._reclaimer is not None:
            self._reclaimer.join()
        self._release_delayed(everything=True)
        sweep_orphans(f"{self.paths.root.name}/")
        self.ledger.emit(
            Ev.SUPERVISOR_STOPPED, owner=self.cfg.owner, stopped=self.stopping.is_set()
        )
        self.ledger.sync()
        with contextlib.suppress(FileNotFoundError):
            owner_file(self.paths, self.cfg.owner).unlink()
        if self.errors:
            raise self.errors[0]

    def request_stop(self, *, cold: bool = False) -> None:
        """Warm stop on the first call, cold on the second (or when ``cold``)."""
        first = not self.stopping.is_set()
        self.cold = self.cold or cold or not first
        self.stopping.set()
        self.ledger.emit(Ev.SHUTDOWN, mode="cold" if self.cold else "warm")
        for live in list(self.live.values()):
            live.handle.cancel(hard=self.cold)
        with self._cond:
            self._cond.notify_all()

    def _keep(self) -> None:
        """Cap logs, release due retries; heartbeat and reclaim less often.

        It ticks once a second, faster (down to 20 ms) while a log grows fast, so a flooding task
        overshoots its cap by little; the heartbeat runs at least four times per lease_ttl.
        """
        beat_every = min(self.cfg.heartbeat, self.cfg.lease_ttl / 4)
        next_beat = next_reclaim = 0.0
        tick = min(1.0, beat_every)
        while not self._done_keeping.wait(tick):
            now = time.monotonic()
            tick = min(1.0, beat_every) if self._cap_logs() else FAST_TICK
            self._release_delayed(everything=self.stopping.is_set())
            if now >= next_beat:
                next_beat = now + beat_every
                self.ledger.sync()
                with contextlib.suppress(FileNotFoundError):
                    os.utime(owner_file(self.paths, self.cfg.owner))
            if now >= next_reclaim and not self.stopping.is_set():
                next_reclaim = now + self.cfg.lease_ttl / 3
                if self._reclaimer is None or not self._reclaimer.is_alive():
                    # its own thread: killing a dead owner's stubborn leftovers takes a grace
                    # period, and the heartbeat must not wait for it
                    self._reclaimer = threading.Thread(target=self._reclaim, daemon=True)
                    self._reclaimer.start()

    def _cap_logs(self) -> bool:
        """Cap every live attempt's log; False when one is growing fast (check again soon)."""
        calm = True
        sizes: dict[Path, int] = {}
        for live in list(self.live.values()):
            path = self.paths.attempt_log(live.task_id, live.attempt)
            if cap_log(path, self.cfg.max_log_bytes):
                calm = False
            with contextlib.suppress(FileNotFoundError):
                sizes[path] = path.stat().st_size
                if sizes[path] - self._log_sizes.get(path, 0) > self.cfg.max_log_bytes // 8:
                    calm = False
        self._log_sizes = sizes
        return calm

    def _reclaim(self) -> None:
        owner = self.cfg.owner
        if reclaim_dead(self.queue, self.ledger, owner, lease_ttl=self.cfg.lease_ttl):
            with self._cond:
                self._generation += 1
                self._cond.notify_all()

    def _release_delayed(self, *, everything: bool) -> None:
        """Move retries whose backoff is over (or all of them, on stop) back to pending/."""
        now = time.time()
        while True:
            with self._cond:
                if not self._delayed or (not everything and self._delayed[0][0] > now):
                    return
                _, _, claimed = heapq.heappop(self._delayed)
            claimed.data.pop("retry_at", None)
            self.queue.move(claimed, State.PENDING, self._requeued(claimed, "retry", "waiting"))
            self._release(requeued=True)

    def _requeued(self, claimed: Claimed, reason: str, frm: str) -> Callable[[], object]:
        return lambda: self.ledger.emit(Ev.REQUEUED, task=claimed.task_id, reason=reason, frm=frm)

    # -- one slot --------------------------------------------------------------------------------
    def _slot_main(self, slot: Slot) -> None:
        history: deque[AttemptEnd] = deque(maxlen=max(1, self.cfg.breaker_failures))
        try:
            home_env = self._prepare_home(slot)
            while not self.stopping.is_set():
                claimed, generation = self._claim(slot)
                if claimed is None:
                    if self._wait_for_work(generation):
                        continue
                    return
                try:
                    end = self._run_claimed(slot, claimed, home_env)
                finally:
                    self._release()
                if end is not None and self._trips(history, end):
                    self._quarantine(slot, history)
                    return
        except BaseException as exc:  # a bug or a broken disk: stop the run, keep the queue
            self.errors.append(exc)
            self.request_stop()

    def _claim(self, slot: Slot) -> tuple[Claimed | None, int]:
        with self._cond:
            self._in_flight += 1  # before the claim, so idle slots never quit while we may requeue
            generation = self._generation
        claimed = self.queue.claim(self.cfg.owner, slot.index)
        if claimed is None:
            self._release(requeued=False, busy=False)
        return claimed, generation

    def _release(self, *, requeued: bool = False, busy: bool = True) -> None:
        with self._cond:
            self._in_flight -= 1
            if busy:
                self._busy_at = time.monotonic()
            if requeued:
                self._generation += 1
            self._cond.notify_all()

    def _wait_for_work(self, seen_generation: int) -> bool:
        """Block while other slots run attempts that may be requeued; True = try to claim again."""
        with self._cond:
            while True:
                if self.stopping.is_set():
                    return False
                if self._generation != seen_generation:
                    return True
                if self._in_flight == 0:
                    if self._others_running():
                        self._cond.wait(IDLE_POLL_SECONDS)  # their retries land in pending/
                        return True
                    if time.monotonic() - self._busy_at < self.cfg.linger:
                        self._cond.wait(LINGER_POLL_SECONDS)  # new tasks may be enqueued
                        return True
                    return False
                if self.cfg.linger > 0:  # others are busy, but a new task must not wait for them
                    self._cond.wait(LINGER_POLL_SECONDS)
                    return True
                self._cond.wait()

    def _others_running(self) -> bool:
        """Whether other supervisors hold tasks (they may requeue them, or die and be reclaimed)."""
        return any(
            (lease := lease_of(name)) is not None and lease[0] != self.cfg.owner
            for name in self.queue.names(State.RUNNING)
        )

    def _trips(self, history: deque[AttemptEnd], end: AttemptEnd) -> bool:
        """Record an attempt's end; True when the slot's last N attempts all failed fast."""
        if end.kind is EndKind.CANCELLED or self.cfg.breaker_failures <= 0:
            return False
        history.append(end)
        return (
            len(history) == self.cfg.breaker_failures
            and not any(e.ok for e in history)
            and history[-1].ended - history[0].ended <= self.cfg.breaker_window
        )

    def _quarantine(self, slot: Slot, history: deque[AttemptEnd]) -> None:
        span = history[-1].ended - history[0].ended
        reason = (
            f"its last {len(history)} attempts failed within {span:.0f}s "
            f"(last: {history[-1].reason}); check the GPU and its driver"
        )
        self.quarantined.append({"slot": slot.label, "gpus": list(slot.gpu_ids), "reason": reason})
        self.ledger.emit(Ev.QUARANTINED, slot=slot.label, gpus=list(slot.gpu_ids), reason=reason)

    def _prepare_home(self, slot: Slot) -> dict[str, str]:
        if not self.cfg.isolate_home:
            return {}
        return prepare_home(self.paths.slot_home(slot.index), self.cfg.provisions)

    # -- one attempt -----------------------------------------------------------------------------
    def _run_claimed(
        self, slot: Slot, claimed: Claimed, home_env: dict[str, str]
    ) -> AttemptEnd | None:
        try:
            task = TaskSpec.model_validate(claimed.data["task"])
        except ValidationError as exc:  # parseable JSON, but not a task we can run
            first = str(exc).splitlines()[1:2] or ["invalid"]
            self.queue.quarantine(claimed.path, "invalid-task")
            self.ledger.emit(
                Ev.CORRUPT,
                task=task_id_of(claimed.name),
                file=claimed.name,
                reason=f"invalid task: {first[0]}",
            )
            return None
        number = len(claimed.data["attempts"]) + 1
        if self.stopping.is_set():
            self._hand_back(claimed, task, None)
            return None
        gpu_ids = slot.gpu_ids[: task.gpus] if task.gpus else slot.gpu_ids
        values = self._values(task, slot, gpu_ids, number)
        spec = self._launch_spec(task, slot, gpu_ids, number, values, home_env)
        handle = Attempt.launch(spec)
        started = time.time()
        self.live[slot.index] = LiveAttempt(slot, task.id, task.name, number, started, handle)
        self.ledger.emit(
            Ev.STARTED,
            task=task.id,
            attempt=number,
            slot=slot.label,
            gpus=list(gpu_ids),
            pid=handle.pid,
            name=task.name,
            timeout=task.timeout,
        )
        if self.stopping.is_set():
            handle.cancel(hard=self.cold)
        end = handle.wait()
        del self.live[slot.index]
        record = self._record(end, slot, gpu_ids, number)
        cap_log(self.paths.attempt_log(task.id, number), self.cfg.max_log_bytes)
        if end.kind is EndKind.CANCELLED:
            self._hand_back(claimed, task, record)
            return end
        outcome = self._judge(task, end, values, record, claimed)
        self._finish(claimed, task, outcome)
        return end

    def _values(
        self, task: TaskSpec, slot: Slot, gpu_ids: tuple[int, ...], n: int
    ) -> dict[str, str]:
        return {
            **task.vars,
            "workspace": str(self.paths.task_dir(task.id)),
            "run_dir": str(self.paths.root),
            "task_id": task.id,
            "name": task.name,
            "attempt": str(n),
            "gpu_ids": ",".join(map(str, gpu_ids)),
            "gpu": str(gpu_ids[0]) if gpu_ids else "",
            "slot": str(slot.index),
        }

    def _launch_spec(
        self,
        task: TaskSpec,
        slot: Slot,
        gpu_ids: tuple[int, ...],
        n: int,
        values: dict[str, str],
        home_env: dict[str, str],
    ) -> LaunchSpec:
        log = self.paths.attempt_log(task.id, n)  # Attempt.launch makes its folder
        env = {**os.environ, **home_env}
        env.update(render_env(task, values))
        env.update(isolation_env(slot, gpu_ids))
        env.update(
            GPUSWARM_RUN_DIR=str(self.paths.root),
            GPUSWARM_TASK_ID=task.id,
            GPUSWARM_TASK_NAME=task.name,
            GPUSWARM_TASK_WORKSPACE=values["workspace"],
            GPUSWARM_ATTEMPT=str(n),
            GPUSWARM_OWNER=self.cfg.owner,
        )
        if "task_dir" in task.vars:
            env["GPUSWARM_TASK_DIR"] = task.vars["task_dir"]
        cwd = render_cwd(task, values, self.cfg.base_dir)
        return LaunchSpec(
            argv=render_command(task, values),
            env=env,
            cwd=cwd,
            log_path=log,
            timeout=task.timeout,
            grace=task.grace,
            token=f"{self.paths.root.name}/{task.id}/{n}",
        )

    @staticmethod
    def _record(end: AttemptEnd, slot: Slot, gpu_ids: tuple[int, ...], n: int) -> dict[str, Any]:
        return {
            "n": n,
            "slot": slot.label,
            "gpus": list(gpu_ids),
            "started": round(end.started, 4),
            "ended": round(end.ended, 4),
            "duration": round(end.duration, 4),
            "kind": end.kind.value,
            "returncode": end.returncode,
            "signal": end.signal,
            "reason": end.reason,
            "oom": end.oom,
            "killed": end.killed,
        }

    def _judge(
        self,
        task: TaskSpec,
        end: AttemptEnd,
        values: dict[str, str],
        record: dict[str, Any],
        claimed: Claimed,
    ) -> Outcome:
        log = self.paths.attempt_log(task.id, record["n"])
        record["metrics"] = parse_metrics(log, task.metrics)
        if not end.ok:
            return Outcome(State.FAILED, end.reason, record)
        if task.done_when:
            target = self.paths.task_dir(task.id) / render(task.done_when, values)
            try:
                result = load_result_file(target)
            except ResultFileError as exc:
                reason = f"exit 0 but {exc}"
                record["reason"] = reason
                return Outcome(State.FAILED, reason, record)
            claimed.data["result"] = flatten(result)
        return Outcome(State.DONE, end.reason, record)

    def _finish(self, claimed: Claimed, task: TaskSpec, outcome: Outcome) -> None:
        data = claimed.data
        data["attempts"].append(outcome.record)
        state = outcome.state
        retry = state is State.FAILED and attempts_used(data) < task.max_attempts
        delay = self._backoff(attempts_used(data)) if retry and not self.stopping.is_set() else 0
        data["reason"] = outcome.reason if state is State.FAILED and not retry else None
        if delay > 0:  # wait in running/ under our lease; the keeper requeues it when due
            data["retry_at"] = round(time.time() + delay, 3)
            self.queue.save(claimed)
            with self._cond:
                self._in_flight += 1  # idle slots must not quit while a retry waits
                self._delay_seq += 1
                heapq.heappush(self._delayed, (data["retry_at"], self._delay_seq, claimed))
        rec = outcome.record

        def announce() -> None:
            self.ledger.emit(
                Ev.FINISHED,
                task=task.id,
                attempt=rec["n"],
                slot=rec["slot"],
                state="waiting" if delay > 0 else ("pending" if retry else state.value),
                reason=outcome.reason,
                seconds=rec["duration"],
                retry=retry,
                retry_in=round(delay, 3),
                max_attempts=task.max_attempts,
            )

        if delay > 0:
            announce()
        else:
            self.queue.move(claimed, State.PENDING if retry else state, announce)
        if retry and delay <= 0:
            with self._cond:
                self._generation += 1
                self._cond.notify_all()

    def _backoff(self, used: int) -> float:
        base = self.cfg.retry_backoff
        return 0.0 if base <= 0 else min(MAX_BACKOFF_SECONDS, base * 2 ** max(0, used - 1))

    def _hand_back(self, claimed: Claimed, task: TaskSpec, record: dict[str, Any] | None) -> None:
        """A stop interrupted this task: back to pending/, not counted as a failed attempt."""
        if record is not None:
            record["interrupted"] = True
            claimed.data["attempts"].append(record)
        claimed.data["interruptions"] = claimed.data.get("interruptions", 0) + 1
        self.queue.move(claimed, State.PENDING, self._requeued(claimed, "interrupted", "running"))
