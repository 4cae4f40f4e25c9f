"""Composition: a validated config + GPUs -> a run directory -> a supervised run -> outputs.

The CLI calls these functions; they hold no terminal logic beyond choosing a reporter.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuswarm.app.controlframe import finish_adds
from gpuswarm.app.ending import after_all, aggregate, all_ended, budget_line
from gpuswarm.app.output import Output, after_disk_full, reporter, say, write_report_safely
from gpuswarm.app.planning import (
    check_backend,
    check_backend_ready,
    gpu_keys_of,
    plan,
    resolve_provisions,
)
from gpuswarm.app.prepare import prepare
from gpuswarm.app.reconfigure import (
    apply_config,
    check_config_change,
    remember_budget,
    remember_moved,
)
from gpuswarm.app.setup import Setup, driver_of, new_run, resume_driven
from gpuswarm.app.slurmdriver import in_allocation, run_in_allocation
from gpuswarm.config.backends import plugin_of
from gpuswarm.config.load import LoadedConfig
from gpuswarm.core.errors import (
    ConfigError,
    PreflightError,
    disk_full,
)
from gpuswarm.core.events import Ev
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.secretvalues import run_redactor
from gpuswarm.core.signals import on_stop_signals
from gpuswarm.core.words import counted
from gpuswarm.exec.base import Backend, create_backend, membership_of
from gpuswarm.exec.sandbox import Provision
from gpuswarm.exec.slurm.session import check_nodes_see
from gpuswarm.notify.start import last_word, notifier_for
from gpuswarm.outputs.runreport import RunReport
from gpuswarm.placement.devices import GpuSet
from gpuswarm.placement.gpus import Slot
from gpuswarm.placement.hostlock import GpuHold
from gpuswarm.store import release, runindex
from gpuswarm.store.created import Created
from gpuswarm.store.leases import (
    attach,
    owner_id,
    register_named_slots,
    register_slots,
    write_owner_file,
)
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.names import task_id_of
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.runs import NewRun, create_run, open_record
from gpuswarm.store.spool import streamed
from gpuswarm.supervise.preflight import missing_programs, run_preflight
from gpuswarm.supervise.recovery import reclaim_dead, recover
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig

if TYPE_CHECKING:
    from gpuswarm.notify.notifier import Notifier

__all__ = [
    "resume_run",
    "start_run",
    "supervise",
    "work_run",
]


def start_run(
    loaded: LoadedConfig,
    gpus_spec: str | None,
    *,
    suffix: str | None,
    output: Output,
    share_gpus: bool = False,
) -> RunReport:
    """Validate everything, create the run directory, and supervise it to the end."""
    check_backend(loaded)
    if (driver := driver_of(loaded.config.backend)) is not None:  # its workers run elsewhere
        return driver.start(loaded, gpus_spec, suffix=suffix, output=output)
    gpus, slots = plan(loaded, gpus_spec)
    provisions = resolve_provisions(loaded)
    count = len(loaded.tasks)
    if loaded.config.backend == "local":  # elsewhere the programs are the image's
        _check_programs(loaded, count, output)
    check_backend_ready(loaded, gpus_spec)
    check_nodes_see(loaded.workspace)  # issue 36: every node of a Slurm allocation sees it
    hold = GpuHold.acquire(gpu_keys_of(slots), run="", share=share_gpus)  # before anything is made
    try:
        return _start(loaded, gpus, slots, provisions, count, hold, suffix=suffix, output=output)
    finally:
        hold.release()


def _start(
    loaded: LoadedConfig,
    gpus: GpuSet,
    slots: list[Slot],
    provisions: tuple[Provision, ...],
    count: int,
    hold: GpuHold,
    *,
    suffix: str | None,
    output: Output,
) -> RunReport:
    created = Created()  # what it writes, remembered for the end-of-run outputs (issue 31)
    new = new_run(loaded, gpus, slots, stream=True, created=created)  # one at a time, no copy
    paths = _create(new, suffix)
    hold.set_run(str(paths.root))
    loaded.tasks.clear()  # the queue has them now: a 100k-task list is not kept for the run
    plugin = plugin_of(loaded.config.backend)
    where = counted(len(slots), "slot") if slots else f"{plugin.slots_phrase} ({gpus.spec})"
    say(output, f"{counted(count, 'task')} on {where}; run dir: {paths.root}")
    info = RunRecord.from_json(new.info)
    setup = prepare(info=info, config=loaded, planned=(gpus, slots), provisions=provisions)
    return supervise(paths, setup, mode="run", output=output, hold=hold, created=created)


def _check_programs(loaded: LoadedConfig, count: int, output: Output) -> None:
    """Before anything is created: a run whose every task runs a program that cannot be found
    ends here, with one line naming it; some such tasks get a warning (they will fail)."""
    missing, _ = missing_programs(loaded.tasks, loaded.base_dir)
    if not missing:
        return
    named = ", ".join(f"{p} ({n} task{'s' if n != 1 else ''})" for p, n in sorted(missing.items()))
    if sum(missing.values()) >= count:
        raise PreflightError(
            f"command not found: {named}; every task runs it and none can start. Install it "
            "or fix PATH (or the task's env: PATH); nothing was started"
        )
    say(output, f"gpuswarm: warning: command not found: {named}; those tasks will fail")


def _create(new: NewRun, suffix: str | None) -> RunPaths:
    """create_run; a workspace that is a file, read-only or not ours is bad input (exit 2)."""
    try:
        return create_run(new, suffix=suffix)
    except OSError as exc:
        bad_place = (NotADirectoryError, FileExistsError, PermissionError)
        if not isinstance(exc, bad_place) and exc.errno != errno.EROFS:
            raise
        raise ConfigError(
            f"workspace {new.workspace}: cannot create the run folder there "
            f"({exc.strerror or exc}: {exc.filename or new.workspace}); choose another "
            "workspace (workspace: in the config, or --workspace)"
        ) from None


def resume_run(
    run_dir: Path,
    gpus_spec: str | None,
    *,
    retry_failed: bool,
    new_config: LoadedConfig | None,
    allow_change: bool,
    output: Output,
    share_gpus: bool = False,
    backend_options: Mapping[str, Any] | None = None,
    halt: str | None = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
) -> RunReport:
    paths, info = open_record(run_dir)
    if (driven := resume_driven(paths, info, output, retry_failed=retry_failed)) is not None:
        return driven  # its workers run elsewhere (slurm's worker jobs, from the login node)
    setup = prepare(
        info=info,
        gpus=gpus_spec,
        halt=halt,
        budget_usd=budget_usd,
        budget_tokens=budget_tokens,
        backend_options=backend_options,  # e.g. a cluster that moved (a new head after a loss)
    )
    if new_config is not None:
        check_config_change(paths, info, new_config, allow_change)
    return supervise(
        paths,
        setup,
        mode="resume",
        output=output,
        retry_failed=retry_failed,
        new_config=new_config if allow_change else None,
        share_gpus=share_gpus,
    )


def work_run(
    run_dir: Path,
    gpus_spec: str,
    *,
    output: Output,
    share_gpus: bool = False,
    halt: str | None = None,
) -> RunReport:
    """Attach more GPUs (or another host on a shared filesystem) to a run, live or not."""
    paths, info = open_record(run_dir)
    setup = prepare(info=info, gpus=gpus_spec, halt=halt)
    single = plugin_of(setup.backend).single_driver
    if single:
        raise ConfigError(f"{paths.root}: {single}")
    return supervise(paths, setup, mode="work", output=output, share_gpus=share_gpus)


# -- supervising -------------------------------------------------------------------------------
def supervise(
    paths: RunPaths,
    setup: Setup,
    *,
    mode: str,
    output: Output,
    retry_failed: bool = True,
    new_config: LoadedConfig | None = None,
    hold: GpuHold | None = None,
    share_gpus: bool = False,
    created: Created | None = None,
) -> RunReport:
    """Attach to the run, initialise (recover / reclaim), run the slots, write the outputs.

    ``mode``: ``run`` (a fresh run), ``resume`` (no other supervisor may be live; repairs
    everything) or ``work`` (joins live supervisors; reclaims only dead owners' tasks).
    ``created``: what a fresh run's creation wrote (store/created.py), for its outputs.
    """
    own_hold = hold is None  # resume / work: hold this run's GPUs now (same run never blocks)
    if hold is None:
        hold = GpuHold.acquire(gpu_keys_of(setup.slots), run=str(paths.root), share=share_gpus)
    try:
        return _supervise(paths, setup, mode, output, retry_failed, new_config, created)
    finally:
        if own_hold:
            hold.release()


def _index_joined(paths: RunPaths, info: RunRecord, mode: str) -> None:
    """A run resumed or joined here that the index of the user's runs lacks (made before the
    index existed, or on another host) is found from anywhere from now on."""
    if mode != "run":  # a new run was indexed at its creation
        runindex.remember(paths.root.resolve(), info.name or paths.root.name)


def _supervise(
    paths: RunPaths,
    setup: Setup,
    mode: str,
    output: Output,
    retry_failed: bool,
    new_config: LoadedConfig | None,
    created: Created | None = None,
) -> RunReport:
    owner = owner_id()
    cfg, alloc = in_allocation(setup.supervisor_config(owner), paths, mode)  # Slurm's (36)
    recovered = None
    backend = create_backend(cfg.backend, setup.backend_options(paths, owner, cfg.max_log_bytes))
    if mode != "run":  # a new run checked it before it was created (check_backend_ready)
        backend.check()  # before anything is claimed: the daemon answers, the image is there
    with attach(paths, exclusive_start=mode == "resume") as hold:
        _, snapshot = open_record(paths.root)
        _index_joined(paths, snapshot, mode)
        redactor = run_redactor(snapshot.to_json())
        ledger = Ledger(paths.events, redact=redactor.text)  # reasons, names
        queue = DirQueue(
            paths, on_corrupt=lambda name, why: _corrupt(ledger, name, why), created=created
        )
        notifier: Notifier | None = None
        try:
            if mode == "resume":
                finish_adds(paths)  # a `gpuswarm add` a crash cut short: finished or undone
                recovered = recover(
                    queue, ledger, retry_failed=retry_failed, backend=backend, applied_by=owner
                )
            reclaim_dead(queue, ledger, owner, lease_ttl=cfg.lease_ttl, backend=backend)
            release.settle_locked(queue, ledger, only=mode == "work")  # issue 35: see there
            if mode == "resume":
                remember_moved(paths, ledger, setup)
                remember_budget(paths, setup)
            if new_config is not None:
                apply_config(paths, queue, ledger, new_config)
            setup = replace(setup, slots=_registered_slots(paths, owner, setup, cfg, backend))
            cfg = replace(cfg, slots=setup.slots)  # unique slot ids: homes, events, lanes
            _preflight(paths, setup, cfg, backend)
            if setup.preflight:
                ledger.emit(Ev.PREFLIGHT, ok=True, slots=[s.label for s in setup.slots])
            write_owner_file(paths, owner, {"slots": [s.label for s in setup.slots]})
            hold.end_init()
            sup = Supervisor(paths, queue, ledger, cfg, backend)
            shown = reporter(paths, queue, ledger, setup.slots, output, sup.gpus.slot_stats)
            started = time.time()
            notifier = notifier_for(paths, snapshot, redactor.text, mode)  # 37
            with on_stop_signals(lambda: sup.request_stop(), named=sup.shared.stopped_by), shown:
                try:
                    with streamed(
                        paths, queue.push, ledger, sup.request_stop, created
                    ):  # a big run's
                        run_in_allocation(sup, alloc, paths, mode, ledger, output)
                    notifier = last_word(  # its own thread; waits at most notify.end_wait
                        notifier,
                        stopped=sup.stopping.is_set() and sup.halt.reason is None,
                        why=sup.shared.ended_by or sup.shared.stop_cause,
                    )
                    summary, info = aggregate(paths, queue, ledger, sup, started)
                    if setup.after_all and all_ended(queue) and not sup.stopping.is_set():
                        after_all(paths, ledger, setup, output, sup, summary, backend)
                except OSError as exc:
                    if not disk_full(exc):
                        raise
                    raise after_disk_full(paths, queue, exc) from None
                if output.report:
                    write_report_safely(paths, queue, summary, info, output)
        finally:
            last_word(notifier, stopped=True, why="the supervisor failed")  # an error ended it
            try:
                ledger.close()
            except OSError as exc:  # the journal's last fsync: the disk may be full
                if not disk_full(exc):
                    raise
    halted = sup.halt.reason
    budget = budget_line(sup.budget)  # issue 34: the budget was spent
    stopped = sup.stopping.is_set() and halted is None and budget is None  # they stop too
    return RunReport(
        paths,
        summary,
        interrupted=stopped,
        recovered=recovered,
        stopped_by=sup.shared.ended_by,
        halted=halted,
        budget=budget,
    )


def _registered_slots(
    paths: RunPaths, owner: str, setup: Setup, cfg: SupervisorConfig, backend: Backend
) -> list[Slot]:
    """The run's slots with ids unique in it: planned from --gpus, or a cluster's, which the
    backend makes (and more as nodes join: supervise/membership.py)."""
    membership = membership_of(backend)
    if membership is None:
        return register_slots(paths, owner, setup.slots, cfg.lease_ttl)
    return register_named_slots(paths, owner, membership.initial_slots(), cfg.lease_ttl)


def _preflight(paths: RunPaths, setup: Setup, cfg: SupervisorConfig, backend: Backend) -> None:
    """The ``preflight:`` commands on every slot, through the backend opened for them: its log
    pump caps their output like a task's (``max_log_mb``); closed again if they fail."""
    if not setup.preflight:
        return
    backend.open()
    try:
        run_preflight(
            paths,
            setup.slots,
            setup.preflight,
            cwd=setup.base_dir,
            isolate=setup.isolate,
            provisions=setup.provisions,
            base_env=cfg.base_env,
            backend=backend,
            max_log_bytes=cfg.max_log_bytes,
        )
    except BaseException:
        backend.close()  # what open() started (Supervisor.run closes it otherwise)
        raise


def _corrupt(ledger: Ledger, name: str, reason: str) -> None:
    ledger.emit(Ev.CORRUPT, task=task_id_of(name), file=name, reason=reason)
