"""A reader's liveness probe (``is_live``: status, watch and the dashboard, which asks every
second) holds a run's live lock exclusively for an instant; a supervisor attaching at that
instant used to go on without the lock (the failed non-blocking acquire was ignored): the run
then read as not live, and a ``resume`` could start beside it."""

from __future__ import annotations

import threading
from pathlib import Path

from gpuswarm.app import api
from gpuswarm.store.leases import FileLock, attach, is_live


def test_attach_waits_out_a_liveness_probe(tmp_path: Path) -> None:
    spec = api.NewRunSpec(
        workspace=tmp_path,
        folder="probe",
        name="probe",
        base_dir=tmp_path,
        gpus=api.plan_gpus("sim:1"),
        source="test",
    )
    run = api.create_run(spec)
    run.live_lock.touch()
    probe = FileLock(run.live_lock)
    assert probe.acquire(exclusive=True)  # a probe caught in the middle of its check
    released = threading.Event()

    def release() -> None:
        probe.release()
        released.set()

    threading.Timer(0.3, release).start()
    with attach(run, exclusive_start=False):
        assert released.is_set()  # it waited for the probe, then took the lock
        assert is_live(run)
    assert not is_live(run)
