"""Issue 28 item 4, in process: a live supervisor whose loop sleeps beside a long attempt is
woken by the ``added`` marker (its keeper's quick look) and claims for its idle slot.

The priority path: a task reaches pending/ without touching the marker (as a file written by
hand or a writer that died before it touched it would), the idle slot does not see it; a
``gpuswarm priority`` of it touches the marker and the slot starts it while the long attempt
still runs. Real processes, sim slots."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuswarm.app.control import set_priority
from gpuswarm.config.models import TaskSpec
from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact
from gpuswarm.core.models import Descriptor
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store.ledger import Ledger, read_events
from gpuswarm.store.names import descriptor_name
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import NewRun, create_run
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

PY = sys.executable


def task(tid: str, code: str) -> dict[str, Any]:
    return TaskSpec(id=tid, name=tid, command=[PY, "-c", code]).model_dump(mode="json")


def started(events_path: Path) -> list[str]:
    return [str(e["task"]) for e in read_events(events_path) if e["ev"] == "started"]


def test_a_priority_change_wakes_the_idle_slot_beside_a_long_attempt(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    long = f"import os,time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.02)"
    paths = create_run(NewRun("wake", tmp_path, {"name": "wake"}, [task("long", long)]))
    slots = plan_slots(parse_gpu_spec("sim:2"))
    cfg = SupervisorConfig(slots, tmp_path, owner="wake:1:1", heartbeat=0.2)
    sup = Supervisor(paths, DirQueue(paths, durable=False), Ledger(paths.events), cfg)
    runner = threading.Thread(target=sup.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while "long" not in started(paths.events):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        desc = Descriptor.new(task("late", "pass"), 7)  # in pending/, the marker untouched
        name = descriptor_name(desc.priority, 7, "late")
        atomic_write_bytes(paths.state_dir("pending") / name, dumps_compact(desc.raw))
        time.sleep(0.5)  # (a loop that would see it anyway claims it meanwhile: no harm)
        set_priority(paths.root, "late", 5)
        deadline = time.monotonic() + 10  # generous; without the wake: never, until the gate
        while "late" not in started(paths.events):
            assert time.monotonic() < deadline, "the idle slot never started the task"
            time.sleep(0.02)
        assert not gate.exists()  # the long attempt still runs
    finally:
        gate.touch()
        runner.join(60)
    assert not runner.is_alive()
    assert sorted(started(paths.events)) == ["late", "long"]
