"""Slurm, composed (issue 36, docs/cluster.md). :func:`in_allocation` and
:func:`run_in_allocation`: a supervisor inside an allocation, with a worker on each other node.
The rest: ``backend: slurm`` from the login node (:data:`DRIVER`, the backend's
``BackendPlugin.driver``), worker jobs, not GPUs.

The login-node process makes the run folder (on a filesystem the nodes see), then submits
worker jobs (exec/slurm/jobs.py: one ``gpuswarm work RUN --gpus auto`` per node of each job)
and watches them; it runs no attempt and touches no GPU. While tasks are pending or running and
none of its jobs is pending or running (the last one ended, was cancelled, preempted, its node
died), it submits another, ``slurm.max_jobs`` in all; a dead job's running tasks come back
through their leases, reclaimed by the next job's workers. Each job's changes are journal
events (``slots``, change ``slurm_<state>``, ``host`` the job id, ``node`` its nodes) and
``slurm/jobs.json`` (what ``status`` shows). Ctrl-C / SIGTERM ``scancel``s its jobs (their
workers stop warm on Slurm's SIGTERM); ``gpuswarm resume RUN`` on the login node submits again.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gpuswarm.app.controlframe import finish_adds
from gpuswarm.app.output import Output, say, write_report_safely
from gpuswarm.app.setup import backend_settings_of, recovery_backend, run_info
from gpuswarm.config.backends import settings_of
from gpuswarm.config.commands import task_dumps
from gpuswarm.config.load import LoadedConfig
from gpuswarm.core.errors import ConfigError, RunDirError
from gpuswarm.core.events import Ev
from gpuswarm.core.fsutil import atomic_write_json, read_json
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.core.signals import on_stop_signals
from gpuswarm.core.words import counted
from gpuswarm.exec.slurm import jobs as slurm_jobs
from gpuswarm.exec.slurm import session as slurm
from gpuswarm.exec.slurm.allocation import Allocation
from gpuswarm.exec.slurm.settings import SlurmSettings
from gpuswarm.notify.start import last_word, notifier_for
from gpuswarm.outputs.aggregate import write_outputs
from gpuswarm.outputs.runreport import RunReport
from gpuswarm.outputs.slurmview import JobRecord
from gpuswarm.outputs.summaryjson import SessionEnd
from gpuswarm.placement.devices import GpuSet, Vendor
from gpuswarm.store.leases import attach
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.runs import NewRun, create_run, open_record
from gpuswarm.supervise.context import SupervisorConfig
from gpuswarm.supervise.recovery import recover
from gpuswarm.supervise.supervisor import Supervisor
from gpuswarm.ui.nodefeed import NodeFeed

if TYPE_CHECKING:
    from gpuswarm.notify.notifier import Notifier

JOBS_FILE = "jobs.json"
MAX_OUT_READ = 1 << 20  # of a job's output, for its workers' error lines
SETTLE_SECONDS = 30.0  # the last jobs' end waited for once the work is done
JOB_ERROR = "gpuswarm: error:"  # a worker that could not start says so in the job's output


def check_request(settings: SlurmSettings, where: str) -> None:
    """Slurm accepts the worker job (``sbatch --test-only``) before anything is made."""
    with tempfile.TemporaryDirectory(prefix="gpuswarm-slurm-") as tmp:
        script = Path(tmp) / "job.sh"
        script.write_text(slurm_jobs.script_text(settings, Path(tmp)))
        slurm_jobs.test_submit(settings, script, where)


class LoginNode:
    """``backend: slurm``'s driver (app.setup.RunDriver): from the login node, the run's worker
    jobs run its attempts; this process makes the run, submits and watches them."""

    def start(
        self, loaded: LoadedConfig, gpus_spec: str | None, *, suffix: str | None, output: Output
    ) -> RunReport:
        where = str(loaded.path or "<config>")
        if gpus_spec not in (None, "auto"):
            raise ConfigError(
                f"--gpus {gpus_spec}: with backend: slurm each node takes the GPUs Slurm grants "
                "it (slurm.gpus_per_node, --slurm-gpus-per-node); drop --gpus"
            )
        settings = settings_of(loaded.config)
        assert isinstance(settings, SlurmSettings)  # backend: slurm's (defaults without a block)
        check_request(settings, where)
        count = len(loaded.tasks)
        gpus = GpuSet(Vendor.NVIDIA, (), "auto")  # the nodes': each worker's --gpus auto
        new = NewRun(
            name=loaded.name,
            workspace=loaded.workspace,
            info=run_info(loaded, gpus, []).to_json(),
            tasks=task_dumps(loaded.tasks),
        )
        paths = create_run(new, suffix=suffix)
        loaded.tasks.clear()
        jobs = f"worker jobs of {counted(settings.nodes, 'node')}"
        say(output, f"{counted(count, 'task')} on Slurm {jobs}; run dir: {paths.root}")
        return drive(paths, settings, output)

    def resume(
        self, paths: RunPaths, info: RunRecord, output: Output, *, retry_failed: bool
    ) -> RunReport | None:
        """``gpuswarm resume RUN`` on the login node: recovered as any resume (no supervisor of
        the run may be live: its earlier jobs' workers are gone), then driven again. Inside an
        allocation (None): supervised there, as a run of that allocation."""
        if slurm.allocation_for() is not None:
            return None
        settings = backend_settings_of(info)
        assert isinstance(settings, SlurmSettings)
        return drive(paths, settings, output, resume=True, retry_failed=retry_failed)


DRIVER = LoginNode()


def drive(
    paths: RunPaths,
    settings: SlurmSettings,
    output: Output,
    *,
    resume: bool = False,
    retry_failed: bool = True,
) -> RunReport:
    """Submit and watch the worker jobs until the work is done, holding the run's live lock
    (``status`` shows it live; a second ``resume`` refuses), then write the outputs."""
    _, record = open_record(paths.root)
    redactor = run_redactor(record.to_json())
    ledger = Ledger(paths.events, redact=redactor.text)
    queue = DirQueue(paths)
    driver = JobDriver(paths, settings, queue, ledger, output)
    started = time.time()
    notifier: Notifier | None = None
    try:
        with attach(paths, exclusive_start=resume) as hold, on_stop_signals(driver.stop):
            if resume:
                finish_adds(paths)  # a `gpuswarm add` a crash cut short: finished or undone
                recover(queue, ledger, retry_failed=retry_failed, backend=recovery_backend(record))
            hold.end_init()
            # the run's webhooks (issue 37) are this process's: the nodes' workers send none
            notifier = notifier_for(paths, record, redactor.text)
            driver.run()
        extra: SessionEnd = {"stopped": driver.stopping.is_set()}
        if driver.gave_up:
            extra["stopped_by"] = driver.gave_up
        elif driver.stopping.is_set():
            extra["stopped_by"] = "stopped by hand (its Slurm jobs cancelled)"
        notifier = last_word(notifier, stopped="stopped_by" in extra, why=extra.get("stopped_by"))
        extra["slurm_jobs"] = driver.records
        summary = write_outputs(paths, queue, record, (started, time.time()), extra)
        ledger.emit(Ev.AGGREGATED, counts=summary["counts"], complete=summary["complete"])
        if output.report:
            write_report_safely(paths, queue, summary, record, output)
    finally:
        last_word(notifier, stopped=True, why="the login-node driver failed")  # an error ended it
        ledger.close()
    return RunReport(
        paths,
        summary,
        interrupted=driver.stopping.is_set(),
        stopped_by=driver.gave_up,
    )


class JobDriver:
    def __init__(
        self,
        paths: RunPaths,
        settings: SlurmSettings,
        queue: DirQueue,
        ledger: Ledger,
        output: Output,
    ) -> None:
        self.paths = paths
        self.settings = settings
        self.queue = queue
        self.ledger = ledger
        self.output = output
        self.folder = paths.root / "slurm"
        self.stopping = threading.Event()
        self.gave_up: str | None = None
        self.records: list[JobRecord] = []  # every job submitted, as jobs.json has it
        self._woken = threading.Event()
        self._earlier = 0  # jobs of earlier sessions (a resume)

    def stop(self) -> None:
        self.stopping.set()
        self._woken.set()

    def run(self) -> None:
        self.folder.mkdir(exist_ok=True)
        script = self.folder / "job.sh"
        script.write_text(slurm_jobs.script_text(self.settings, self.paths.root.resolve()))
        script.chmod(0o700)
        self._load_records()
        while not self.stopping.is_set():
            if not self._work_left():
                break
            self._refresh()
            if not any(r["active"] for r in self.records):
                self._check_failed_start()
                if self.gave_up is not None:
                    break
                if len(self.records) - self._earlier >= self.settings.max_jobs:
                    self.gave_up = (
                        f"slurm.max_jobs: {self.settings.max_jobs} worker jobs ran and tasks "
                        "are left; `gpuswarm resume` submits more"
                    )
                    break
                self._submit(script)
            self._woken.wait(self.settings.poll)
        if self.stopping.is_set():
            active = [r["job"] for r in self.records if r["active"]]
            slurm_jobs.cancel(active)
            for job in active:
                self._changed(job, "CANCELLED", "", "cancelled by gpuswarm's stop")
        elif self.gave_up is None:
            self._settle()

    def _settle(self) -> None:
        """The work is done: the last jobs' workers end by themselves; their end recorded."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while any(r["active"] for r in self.records) and time.monotonic() < deadline:
            if self._woken.wait(min(self.settings.poll, 0.5)):
                break
            self._refresh()

    def _check_failed_start(self) -> None:
        """The last job ended and its workers could not even start (gpuswarm said so, or its
        output is not where the run folder is: the nodes do not see it): submitting again
        would fail the same way, so the run stops with what the job said."""
        if not self.records or not self.records[-1].get("nodes"):
            return  # it never ran (cancelled while pending): nothing to judge by
        job = self.records[-1]["job"]
        out = self.folder / f"job-{job}.out"
        if not out.is_file():
            self.gave_up = (
                f"slurm job {job} ended and its output {out} is not there: do the nodes see the "
                "run folder? (the workspace must be on a filesystem every node sees)"
            )
            return
        with contextlib.suppress(OSError):
            with out.open("rb") as fh:
                text = fh.read(MAX_OUT_READ).decode(errors="replace")
            said = [line for line in text.splitlines() if JOB_ERROR in line]
            if said:
                self.gave_up = f"slurm job {job}: {said[0].strip()[:500]} (its output: {out})"

    def _work_left(self) -> bool:
        counts = self.queue.counts()
        return counts[State.PENDING] > 0 or counts[State.RUNNING] > 0

    def _load_records(self) -> None:
        """A resumed run's earlier jobs: kept in jobs.json; a job of theirs still active (the
        login-node process died) is watched again; ``max_jobs`` counts this session's."""
        with contextlib.suppress(OSError, ValueError):
            data = read_json(self.folder / JOBS_FILE)
            found = [r for r in data.get("jobs", []) if isinstance(r, dict) and "job" in r]
            self.records = cast("list[JobRecord]", found)  # this driver's own file, as written
        self._earlier = len(self.records)

    def _submit(self, script: Path) -> None:
        name = f"gpuswarm-{self.paths.root.parent.name}"[:64]
        job = slurm_jobs.submit(self.settings, script, name, self.folder.resolve())
        record: JobRecord = {"job": job, "state": "SUBMITTED", "nodes": "", "active": True,
                  "submitted": round(time.time(), 3), "reason": ""}  # fmt: skip
        self.records.append(record)
        self._write()
        self.ledger.emit(Ev.SLOTS, change="slurm_submitted", host=job, node="")
        of = f"{len(self.records)} of at most {self.settings.max_jobs}"
        say(self.output, f"slurm: submitted worker job {job} ({of}): {self.folder}/job-{job}.out")

    def _refresh(self) -> None:
        active = [r["job"] for r in self.records if r["active"]]
        for job, st in slurm_jobs.job_states(active).items():
            self._changed(job, st.state, st.nodes, st.reason)

    def _changed(self, job: str, state: str, nodes: str, reason: str) -> None:
        record = next(r for r in self.records if r["job"] == job)
        if record["state"] == state and (not nodes or record["nodes"] == nodes):
            return
        record["state"], record["active"] = state, state in slurm_jobs.ACTIVE
        record["reason"] = reason
        if nodes:
            record["nodes"] = nodes
        if not record["active"]:
            record["ended"] = round(time.time(), 3)
        self._write()
        self.ledger.emit(Ev.SLOTS, change=f"slurm_{state.lower()}", host=job, node=nodes)
        where = f" on {nodes}" if nodes else ""
        say(self.output, f"slurm: job {job} {state.lower()}{where}")

    def _write(self) -> None:
        atomic_write_json(self.folder / JOBS_FILE, {"jobs": self.records})


# -- inside an allocation: the engine's supervising, with a worker on each other node ------
def in_allocation(
    cfg: SupervisorConfig, paths: RunPaths, mode: str
) -> tuple[SupervisorConfig, Allocation | None]:
    """The allocation this supervisor runs in (None outside one) and ``cfg`` with its end
    bounding claims; a resume (a new allocation) first checks its nodes see the run."""
    margin = _stop_before_of(paths)
    if mode == "resume":
        alloc = slurm.check_nodes_see(paths.root, margin)
    else:
        alloc = slurm.allocation_for(margin)
    return (replace(cfg, claim_until=alloc.stop_at) if alloc else cfg), alloc


def _stop_before_of(paths: RunPaths) -> float | None:
    """The run's ``slurm.stop_before`` (``--slurm-stop-before``): a ``backend: slurm`` run's
    worker jobs honour it; None for a run of another backend (the default, or the variable)."""
    if not os.environ.get("SLURM_JOB_ID"):  # not in an allocation: nothing to read
        return None
    with contextlib.suppress(OSError, ValueError, RunDirError):
        settings = backend_settings_of(open_record(paths.root)[1])
        if isinstance(settings, SlurmSettings):
            return settings.stop_before
    return None


def run_in_allocation(
    sup: Supervisor,
    alloc: Allocation | None,
    paths: RunPaths,
    mode: str,
    ledger: Ledger,
    output: Output,
) -> None:
    """``sup.run()``; inside a Slurm allocation (issue 36) with a worker on each other node
    (the head), the allocation's end stopping it warm, and tasks its end left pending making
    it a stop."""
    nodes = slurm.Session(alloc, paths.root, mode)
    for note in alloc.notes if alloc is not None else ():
        say(output, f"gpuswarm: warning: {note}")
    with slurm.end_stops(_warm_stop(sup), alloc), contextlib.ExitStack() as shown:
        if others := nodes.start():
            own = [s.label for s in sup.cfg.slots]  # the other nodes' slots are shown too
            shown.enter_context(NodeFeed(paths.events, ledger.relay, own))
            ledger.emit(Ev.SLOTS, change="slurm_workers", node=",".join(others))
            logs = paths.root / "slurm" / "worker-<node>.log"
            say(output, f"slurm: a worker on each of {', '.join(others)} (srun); lines: {logs}")
        try:
            sup.run()
        finally:
            nodes.close()
    if sup.until.refused and not sup.stopping.is_set():  # left for the next allocation
        sup.shared.stopped_by("the allocation ends before their timeout")
        sup.stopping.set()


def _warm_stop(sup: Supervisor) -> Callable[[str], None]:
    """A stop that is never the second (cold) one: after a Ctrl-C it does nothing."""

    def stop(cause: str) -> None:
        if not sup.stopping.is_set():
            sup.shared.stopped_by(cause)
            sup.request_stop()

    return stop
