"""The Backend seam in-process: the registry, the wrapped backend, a spy backend the supervisor
and recovery reach only through the protocol."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.config.models import TaskSpec
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import (
    AttemptEnd,
    Backend,
    BackendOptions,
    Handle,
    LaunchSpec,
    Leftovers,
    backend_names,
    create_backend,
)
from gpuswarm.exec.local.backend import LocalBackend
from gpuswarm.exec.sandbox import Provision
from gpuswarm.exec.wrapped import NoWakeHandle, WrappedBackend
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.recovery import recover
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

PY = sys.executable


def task(tid: str, code: str, **kw: Any) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[PY, "-c", code], **kw).model_dump(mode="json")


class SpyBackend:
    """A third backend, made here: the local one behind NoWakeHandles, counting every call."""

    name = "spy"
    caps_logs = True

    def __init__(self) -> None:
        self.inner = LocalBackend(BackendOptions())
        self.calls: list[str] = []
        self.handles: list[Handle] = []
        self.lock = threading.Lock()

    def open(self) -> None:
        self.calls.append("open")
        self.inner.open()

    def check(self) -> None:
        self.calls.append("check")

    def prepare_slot(self, home: Path | None, provisions: Sequence[Provision]) -> dict[str, str]:
        self.calls.append("prepare_slot")
        return {"SPY_SLOT": "1"}

    def launch(self, spec: LaunchSpec) -> Handle:
        handle = NoWakeHandle(self.inner.launch(spec))
        with self.lock:
            self.calls.append("launch")
            self.handles.append(handle)
        return handle

    def end_leftovers(
        self, *, run_dir: str | None = None, owner: str | None = None, grace: float = 10.0
    ) -> Leftovers:
        self.calls.append(f"end_leftovers:{'run' if run_dir else 'owner'}")
        return Leftovers([], frozenset(), 0)

    def leftovers(self, run_dir: str) -> list[int | str]:
        return []

    def close(self) -> None:
        self.calls.append("close")
        self.inner.close()


def make(
    tmp_path: Path, tasks: list[dict[str, Any]], **kw: Any
) -> tuple[SupervisorConfig, RunPaths, DirQueue]:
    paths = create_run(NewRun("be", tmp_path, {"name": "be"}, tasks))
    slots = plan_slots(parse_gpu_spec("sim:2"))
    cfg = SupervisorConfig(slots, tmp_path, owner="test:1:1", heartbeat=0.2, **kw)
    return cfg, paths, DirQueue(paths, durable=False)


def outcomes(paths: RunPaths) -> dict[str, tuple[str, str]]:
    q = DirQueue(paths)
    return {
        data["id"]: (s.value, data["attempts"][-1]["kind"])
        for s in State
        for _, data in q.iter_state(s)
        if data["attempts"]
    }


MIXED = {
    "ok": ("done", "exited"),
    "bad": ("failed", "exited"),
    "slow": ("failed", "timeout"),
}


def mixed_tasks(tmp_path: Path) -> list[dict[str, Any]]:
    env_check = "import os, sys; sys.exit(0 if os.environ.get('BASE_ONLY') == 'yes' else 4)"
    return [
        task("ok", env_check),
        task("bad", "import sys; sys.exit(3)"),
        task("slow", "import time; time.sleep(30)", timeout=0.5),
    ]


def test_both_backends_and_their_handles_satisfy_the_protocols(tmp_path: Path) -> None:
    """Checked by mypy (the assignments) and at run time (the attributes the loop reads)."""
    backends: list[Backend] = [LocalBackend(BackendOptions()), WrappedBackend(BackendOptions())]
    for backend in backends:
        backend.open()
        try:
            spec = LaunchSpec([PY, "-c", "pass"], {}, tmp_path, tmp_path / backend.name / "log")
            handle: Handle = backend.launch(spec)
            assert handle.wait().ok and handle.end_if_clean() is not None
            assert backend.caps_logs
        finally:
            backend.close()
    spy: Backend = SpyBackend()
    assert spy.name == "spy"


def test_registry_names_and_lazy_creation() -> None:
    assert backend_names() == ["docker", "local", "ray", "slurm", "wrapped"]
    assert isinstance(create_backend("local"), LocalBackend)
    assert isinstance(
        create_backend("wrapped", BackendOptions(max_log_bytes=1 << 20)), WrappedBackend
    )
    with pytest.raises(KeyError):
        create_backend("nope")


def test_wrapped_backend_by_name_runs_every_attempt_in_the_waiter_path(tmp_path: Path) -> None:
    """``backend: wrapped`` gives handles without a wake-up fd: exits, failures and timeouts
    come out as with the local backend (the base environment is the one passed in)."""
    cfg, paths, queue = make(tmp_path, mixed_tasks(tmp_path), backend="wrapped")
    cfg = SupervisorConfig(
        **{**cfg.__dict__, "base_env": {"BASE_ONLY": "yes", "PATH": "/usr/bin:/bin"}}
    )
    sup = Supervisor(paths, queue, Ledger(paths.events), cfg)
    assert sup.backend.name == "wrapped"
    sup.run()
    assert outcomes(paths) == MIXED


def test_supervisor_and_recovery_reach_the_backend_only_through_the_protocol(
    tmp_path: Path,
) -> None:
    cfg, paths, queue = make(tmp_path, mixed_tasks(tmp_path), base_env={"BASE_ONLY": "yes"})
    spy = SpyBackend()
    ledger = Ledger(paths.events)
    recover(queue, ledger, retry_failed=False, grace=0.1, backend=spy)
    sup = Supervisor(paths, queue, ledger, cfg, spy)
    sup.run()
    assert outcomes(paths) == MIXED
    assert spy.calls[0] == "end_leftovers:run"
    assert spy.calls[1] == "open" and spy.calls[-1] == "close"
    assert spy.calls.count("launch") == 3 and spy.calls.count("prepare_slot") == 2
    assert all(h.exit_fd is None and h.done for h in spy.handles)
    started = [e for e in read_events(paths.events) if e["ev"] == "started"]
    assert {e["pid"] for e in started} == {h.pid for h in spy.handles}


def test_wrapped_backend_warm_stop_hands_tasks_back(tmp_path: Path) -> None:
    tasks = [task(f"s{i}", "import time; time.sleep(30)") for i in range(3)]
    cfg, paths, queue = make(tmp_path, tasks, backend="wrapped")
    sup = Supervisor(paths, queue, Ledger(paths.events), cfg)
    runner = threading.Thread(target=sup.run)
    runner.start()
    deadline = time.time() + 20
    while len(sup.live) < 2 and time.time() < deadline:
        time.sleep(0.02)
    sup.request_stop()
    runner.join(30)
    assert not runner.is_alive()
    assert {s for s, _ in outcomes(paths).values()} == {"pending"}


def test_no_wake_handle_hides_only_the_fd(tmp_path: Path) -> None:
    backend = WrappedBackend(BackendOptions())
    backend.open()
    try:
        spec = LaunchSpec([PY, "-c", "pass"], {}, tmp_path, tmp_path / "a" / "output.log")
        handle = backend.launch(spec)
        assert handle.exit_fd is None and handle.pid is not None
        end: AttemptEnd = handle.wait()
        assert end.ok and handle.done and not handle.cancelled
    finally:
        backend.close()


def test_a_retry_released_while_the_loop_looks_is_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the keeper takes a retry off the backoff heap, then moves it to pending/; a
    loop that looked in between saw no retry waiting, no task, and ended: the task was left
    pending. The loop is woken right inside that window here, every time."""
    marker = tmp_path / "marker"
    flaky = (
        f"import pathlib,sys; p=pathlib.Path({str(marker)!r}); e=p.exists(); p.touch(); "
        "sys.exit(0 if e else 1)"
    )
    cfg, paths, queue = make(tmp_path, [task("flaky", flaky, max_attempts=2)], retry_backoff=0.1)
    sup = Supervisor(paths, queue, Ledger(paths.events), cfg)
    move = queue.move

    def slow_release(claimed: Any, state: State, announce: Any, **grouped: Any) -> None:
        if state is State.PENDING and threading.current_thread().name == "keeper":
            sup._wakeup()  # the loop looks now, between the heap and pending/
            time.sleep(0.3)
        move(claimed, state, announce, **grouped)

    monkeypatch.setattr(queue, "move", slow_release)
    sup.run()
    assert outcomes(paths) == {"flaky": ("done", "exited")}
