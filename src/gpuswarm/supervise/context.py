"""What the supervisor's roles share: its settings, the attempts in flight, and the run's handles.

The slot loop (:mod:`.supervisor`), the committer (:mod:`.committer`), the keeper
(:mod:`.keeper`) and the quarantine (:mod:`.quarantine`) each own their own state; what they
all read or signal is here, in one object, so none of them needs the others' internals.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.events import Ev
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import Handle
from gpuswarm.exec.sandbox import Provision
from gpuswarm.placement.gpus import Slot
from gpuswarm.placement.watched import Usage
from gpuswarm.store.control import Paused, Request
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import Claimed, DirQueue

HEARTBEAT_SECONDS = 5.0


def _environ() -> dict[str, str]:
    return dict(os.environ)


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
    breaker_cooldown: float = 300.0  # a quarantined slot is probed again after this long
    max_log_bytes: int = 256 << 20  # each attempt's output.log is kept under this size
    linger: float = 0.0  # an idle supervisor waits this long for new tasks before it ends
    backend: str = "local"  # exec.base.create_backend's name, when no backend is passed in
    # the environment attempts start from (a slot's home over it); the engine passes the
    # supervisor's own, read once at the top (in-process callers get it by default)
    base_env: Mapping[str, str] = field(default_factory=_environ)
    # issue 19, GPU memory: sample VRAM through NVML / amdsmi; an undeclared task reserves
    # 1/gpu_share of its GPU; an ended attempt's GPU waits this long for its memory to be freed
    vram: bool = True
    gpu_share: int = 1
    release_timeout: float = 30.0
    # the ``preflight:`` commands: the engine runs them on the slots there are at the start; a
    # cluster's slots that join later run them before they claim anything (supervise.membership)
    preflight: tuple[str, ...] = ()
    # issue 28: stop early (``halt:`` / ``--halt``, config/halt.py); None: never
    halt: str | None = None
    # issue 36: the end of a Slurm allocation (epoch seconds; supervise/allocation_end.py):
    # no task whose timeout runs past it is claimed
    claim_until: float | None = None
    # issue 34: stop claiming once the agents spent this much (config/budget.py); None: no limit
    budget_usd: float | None = None
    budget_tokens: int | None = None
    budget_on_exceed: str = "finish"  # or "stop": the running attempts are put back too


@dataclass
class LiveAttempt:
    """An attempt between its launch and its outcome (what the keeper and views look at)."""

    slot: Slot
    task_id: str
    name: str
    attempt: int
    started: float
    handle: Handle
    claimed: Claimed
    task: TaskSpec
    gpu_ids: tuple[int, ...]
    values: dict[str, str]
    fd: int | None = None  # the wake-up fd the loop polls (the attempt closes it once it ends)
    fenced: bool = False  # its lease was renamed away (reclaimed): killed, never committed
    # a person's requests that stop it (store.control): its end is committed as they ask
    stopped_by: list[Request] | None = None
    usage: Usage | None = None  # what the VRAM sampler measured, set when it ended
    reserved_mb: int | None = None  # the GPU memory it reserved (declared or raised after OOM)
    stalled: str | None = None  # issue 34: the stall detector stopped it (supervise/stall.py)
    over_usd: str | None = None  # issue 34: max_usd crossed while it ran (supervise/spendwatch)

    @property
    def ending(self) -> bool:
        """Stopped by a person, a stall or ``max_usd``: its end takes TERM, grace, KILL."""
        return self.stopped_by is not None or self.stalled is not None or bool(self.over_usd)


@dataclass
class Shared:
    """The run as every role sees it, and the three signals they send the loop."""

    paths: RunPaths
    queue: DirQueue
    ledger: Ledger
    cfg: SupervisorConfig
    wakeup: Callable[[], None]  # make the loop look again (safe from any thread)
    more_work: Callable[[], None]  # tasks may be back in pending/: claim again
    request_stop: Callable[[], None]  # a warm stop (an error's)
    stopping: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    live: dict[int, LiveAttempt] = field(default_factory=dict)  # slot index -> its attempt
    errors: list[BaseException] = field(default_factory=list)
    paused: Paused = field(default_factory=lambda: Paused(False, frozenset()))  # the keeper's
    ended_by: str | None = None  # why the backend stopped the run (its cluster is gone)
    stop_cause: str | None = None  # what asked for the stop: "Ctrl-C (SIGINT)", "SIGTERM", a halt
    requeued: int = 0  # running tasks a stop put back in the queue (the end-of-run line)

    def stopped_by(self, cause: str) -> None:
        """The first stop's cause (a signal, a halt); later ones (Ctrl-C again) keep it."""
        if self.stop_cause is None:
            self.stop_cause = cause

    def holds(self, slot: Slot) -> bool:
        """Whether ``slot`` is paused now (the run, or the slot: it claims nothing)."""
        return self.paused.holds(slot.label)

    def fail(self, exc: BaseException) -> None:
        """A bug or a broken disk: remember it, stop the run warm, keep the queue. More errors
        (a full disk fails every commit) never turn the stop into a cold one."""
        self.errors.append(exc)
        if not self.stopping.is_set():
            self.request_stop()

    def lease_lost(self, task_id: str, attempt: int | None, what: str) -> None:
        self.ledger.emit(
            Ev.LEASE_LOST,
            task=task_id,
            attempt=attempt,
            owner=self.cfg.owner,
            reason=f"lease lost (another supervisor reclaimed the task): {what}",
        )
