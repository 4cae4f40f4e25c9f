"""``gpuswarm check [--repair]`` and ``gpuswarm report``: a run looked at as it stands (live or
not), with the engine's pieces a repair and a report need, never a supervisor."""

from __future__ import annotations

from pathlib import Path

from gpuswarm.app.controlframe import finish_adds
from gpuswarm.app.setup import recovery_backend
from gpuswarm.core.fsutil import read_json
from gpuswarm.outputs.aggregate import write_outputs
from gpuswarm.outputs.check import CheckReport, check_run
from gpuswarm.outputs.report import write_report
from gpuswarm.outputs.status import run_state
from gpuswarm.store.leases import is_live
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runs import open_record
from gpuswarm.supervise.recovery import recover


def write_run_report(run_dir: Path) -> Path:
    """``gpuswarm report``: the outputs and the report of a run as it stands (live or not)."""
    paths, info = open_record(run_dir)
    queue = DirQueue(paths)
    if paths.summary_json.is_file() and not is_live(paths):
        summary = read_json(paths.summary_json)  # as its supervisor wrote it (wall time, ...)
    else:
        summary = write_outputs(paths, queue, info, None)
    counts = {s.value: n for s, n in queue.counts().items()}
    summary["state"] = run_state(paths, counts, is_live(paths))  # live, crashed, ...
    return write_report(paths, queue, summary, info)


def check_run_dir(run_dir: Path, *, repair: bool = False) -> CheckReport:
    """``gpuswarm check [--repair]``: the findings of :func:`outputs.check.check_run`; a repair
    recovers the run as resume would, ending a dead owner's leftovers through its backend."""
    paths, info = open_record(run_dir)

    def recover_run(queue: DirQueue, ledger: Ledger) -> dict[str, int]:
        backend = recovery_backend(info)
        try:
            finish_adds(queue.paths)
            return recover(queue, ledger, retry_failed=False, backend=backend)
        finally:
            backend.close()

    def leftovers() -> list[int | str]:
        return recovery_backend(info).leftovers(str(paths.root))

    return check_run(run_dir, repair=repair, recover=recover_run, leftovers=leftovers)
