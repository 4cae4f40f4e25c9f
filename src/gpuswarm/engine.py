"""Composition: a validated config + GPUs -> a run directory -> a supervised run -> outputs.

The CLI calls these functions; they hold no terminal logic beyond choosing a reporter.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from gpuswarm import __version__
from gpuswarm.config.commands import task_dumps
from gpuswarm.config.load import LoadedConfig, spec_hash
from gpuswarm.config.models import RunConfig
from gpuswarm.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNFINISHED,
    ConfigError,
    DiskFullError,
    PreflightError,
    disk_full,
)
from gpuswarm.core.fsutil import atomic_write_json, read_json
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.redact import redact_tree
from gpuswarm.core.signals import on_stop_signals
from gpuswarm.exec.sandbox import Provision, check_provision_dest
from gpuswarm.outputs.report import write_report
from gpuswarm.outputs.results import write_outputs
from gpuswarm.outputs.status import run_state
from gpuswarm.placement.gpus import GpuSet, Slot, parse_gpu_spec, plan_slots
from gpuswarm.placement.hostlock import GpuHold, gpu_keys
from gpuswarm.store.leases import attach, is_live, owner_id, register_slots, write_owner_file
from gpuswarm.store.ledger import Ev, Ledger
from gpuswarm.store.queue import DirQueue, State, descriptor_name, new_descriptor, task_id_of
from gpuswarm.store.runs import NewRun, create_run, open_run, reclaim_dead, recover
from gpuswarm.supervise.after_all import run_once
from gpuswarm.supervise.preflight import missing_programs, run_preflight
from gpuswarm.supervise.supervisor import Supervisor, SupervisorConfig
from gpuswarm.ui.live import PlainReporter, is_terminal


@dataclass
class RunReport:
    paths: RunPaths
    summary: dict[str, Any]
    interrupted: bool
    recovered: dict[str, int] | None = None

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        after = self.summary.get("after_all")
        if isinstance(after, dict) and not after.get("ok"):
            return EXIT_UNFINISHED  # the post-processing step failed
        return EXIT_OK if self.summary.get("complete") else EXIT_UNFINISHED


@dataclass(frozen=True)
class Output:
    """Where and how much the supervisor prints."""

    stream: TextIO | None = None
    quiet: bool = False
    live: bool = False  # a live table when the stream is a terminal (else one line per event)
    report: bool = True  # write report.html + timeline.png at the end


# -- building a run ----------------------------------------------------------------------------
def resolve_provisions(loaded: LoadedConfig) -> tuple[Provision, ...]:
    """Check every provisioned file now, so a missing credential fails before anything runs."""
    home = loaded.config.home
    out = []
    for i, item in enumerate(home.provision if home else []):
        src = Path(item.src).expanduser()
        src = src if src.is_absolute() else loaded.base_dir / src
        where = f"{loaded.path or '<config>'}: home.provision[{i}].src"
        if not src.exists():
            raise ConfigError(f"{where}: {src} does not exist; fix the path or remove the entry")
        out.append(Provision(src=src, dest=check_provision_dest(item.dest)))
    return tuple(out)


def _redact_tree(value: Any) -> Any:
    return redact_tree(value)  # env by name and shape, commands and every string by shape


def run_info(loaded: LoadedConfig, gpus: GpuSet, slots: list[Slot]) -> dict[str, Any]:
    cfg = loaded.config
    home = cfg.home
    return {
        "gpuswarm": __version__,
        "name": loaded.name,
        "workspace": str(loaded.workspace),
        "source": str(loaded.path) if loaded.path else "<stdin>",
        "base_dir": str(loaded.base_dir),
        "fingerprint": spec_hash(loaded),
        "gpus": gpus.spec,
        "vendor": gpus.vendor.value,
        "gpu_ids": list(gpus.ids),
        "gpus_per_task": cfg.gpus_per_task,
        "tasks_per_gpu": cfg.tasks_per_gpu,
        "slot_count": len(slots),
        "home": {
            "isolate": bool(home and home.isolate),
            "provision": [{"src": p.src, "dest": p.dest} for p in (home.provision if home else [])],
        },
        "settings": _settings(cfg),
        "config": _redact_tree(cfg.model_dump(mode="json")),
        "task_count": len(loaded.tasks),
        "hosts": [socket.gethostname()],
    }


def _settings(cfg: RunConfig) -> dict[str, Any]:
    rel = cfg.reliability
    return {
        "lease_ttl": rel.lease_ttl,
        "retry_backoff": rel.retry_backoff or 0.0,
        "breaker_failures": rel.breaker.failures,
        "breaker_window": rel.breaker.window,
        "breaker_cooldown": rel.breaker.cooldown,
        "max_log_bytes": int(rel.max_log_mb * (1 << 20)),
    }


@dataclass(frozen=True)
class Setup:
    """What a supervisor needs besides the queue: slots, task defaults, reliability settings."""

    slots: list[Slot]
    base_dir: Path
    isolate: bool
    provisions: tuple[Provision, ...]
    settings: dict[str, Any]
    preflight: tuple[str, ...] = ()  # run once per slot before it claims anything
    after_all: str | None = None  # run once after every slot finished

    def supervisor_config(self, owner: str) -> SupervisorConfig:
        known = set(SupervisorConfig.__dataclass_fields__)
        extra = {k: v for k, v in self.settings.items() if k in known}
        return SupervisorConfig(
            self.slots, self.base_dir, owner, self.isolate, self.provisions, **extra
        )


def setup_from_info(info: dict[str, Any], gpus_spec: str | None) -> Setup:
    """The setup of an existing run (its run.json), on the GPUs given now or its own."""
    gpus = parse_gpu_spec(gpus_spec or str(info.get("gpus") or "auto"))
    slots = plan_slots(gpus, int(info.get("gpus_per_task", 1)), int(info.get("tasks_per_gpu", 1)))
    home = info.get("home", {})
    provisions = tuple(
        Provision(src=Path(p["src"]).expanduser(), dest=p["dest"])
        for p in home.get("provision", [])
    )
    base_dir = Path(info.get("base_dir", "."))
    config = info.get("config") or {}
    return Setup(
        slots,
        base_dir,
        bool(home.get("isolate")),
        provisions,
        info.get("settings", {}),
        tuple(config.get("preflight") or ()),
        config.get("after_all"),
    )


def plan(loaded: LoadedConfig, gpus_spec: str | None) -> tuple[GpuSet, list[Slot]]:
    gpus = parse_gpu_spec(gpus_spec or loaded.config.gpus or "auto")
    slots = plan_slots(gpus, loaded.config.gpus_per_task, loaded.config.tasks_per_gpu)
    return gpus, slots


def start_run(
    loaded: LoadedConfig,
    gpus_spec: str | None,
    *,
    suffix: str | None,
    output: Output,
    share_gpus: bool = False,
) -> RunReport:
    """Validate everything, create the run directory, and supervise it to the end."""
    gpus, slots = plan(loaded, gpus_spec)
    provisions = resolve_provisions(loaded)
    count = len(loaded.tasks)
    _check_programs(loaded, count, output)
    hold = GpuHold.acquire(_keys(slots), run="", share=share_gpus)  # before anything is made
    try:
        return _start(loaded, gpus, slots, provisions, count, hold, suffix=suffix, output=output)
    finally:
        hold.release()


def _keys(slots: list[Slot]) -> list[str]:
    return gpu_keys(slots[0].vendor.value, {i for s in slots for i in s.gpu_ids}) if slots else []


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
    new = NewRun(
        name=loaded.name,
        workspace=loaded.workspace,
        info=run_info(loaded, gpus, slots),
        tasks=task_dumps(loaded.tasks),  # one at a time, never a copy
    )
    paths = _create(new, suffix)
    hold.set_run(str(paths.root))
    loaded.tasks.clear()  # the queue has them now: a 100k-task list is not kept for the run
    _say(output, f"run dir: {paths.root}  ({count} tasks on {len(slots)} slots)")
    isolate = bool(loaded.config.home and loaded.config.home.isolate)
    cfg = loaded.config
    setup = Setup(
        slots,
        loaded.base_dir,
        isolate,
        provisions,
        new.info["settings"],
        tuple(cfg.preflight),
        cfg.after_all,
    )
    return supervise(paths, setup, mode="run", output=output, hold=hold)


def _check_programs(loaded: LoadedConfig, count: int, output: Output) -> None:
    """Before anything is created: a run whose every task runs a program that cannot be found
    ends here, with one line naming it; some such tasks get a warning (they will fail)."""
    missing, _ = missing_programs(task_dumps(loaded.tasks), loaded.base_dir)
    if not missing:
        return
    named = ", ".join(f"{p} ({n} task{'s' if n != 1 else ''})" for p, n in sorted(missing.items()))
    if sum(missing.values()) >= count:
        raise PreflightError(
            f"command not found: {named}; every task runs it and none can start. Install it "
            "or fix PATH (or the task's env: PATH); nothing was started"
        )
    _say(output, f"gpuswarm: warning: command not found: {named}; those tasks will fail")


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
) -> RunReport:
    paths, info = open_run(run_dir)
    setup = setup_from_info(info, gpus_spec)
    if new_config is not None:
        _check_config_change(paths, info, new_config, allow_change)
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
    run_dir: Path, gpus_spec: str, *, output: Output, share_gpus: bool = False
) -> RunReport:
    """Attach more GPUs (or another host on a shared filesystem) to a run, live or not."""
    paths, info = open_run(run_dir)
    setup = setup_from_info(info, gpus_spec)
    return supervise(paths, setup, mode="work", output=output, share_gpus=share_gpus)


def _check_config_change(
    paths: RunPaths, info: dict[str, Any], loaded: LoadedConfig, allow: bool
) -> None:
    if spec_hash(loaded) == info.get("fingerprint"):
        return
    if not allow:
        raise ConfigError(
            f"{loaded.path}: the config differs from the snapshot this run was created with "
            f"({paths.run_json}); pass --allow-config-change to apply it to unfinished tasks, "
            "or resume without --config"
        )


def apply_config(paths: RunPaths, queue: DirQueue, ledger: Ledger, loaded: LoadedConfig) -> int:
    """Under the run lock: update pending tasks' specs and enqueue tasks the run lacks."""
    known: dict[str, tuple[State, str]] = {}
    max_seq = -1
    for state in State:
        for name in queue.names(state):
            data = queue.read(state, name) or {}
            if "id" in data:
                known[data["id"]] = (state, name)
                max_seq = max(max_seq, int(data.get("seq", 0)))
    added = 0
    for dump in task_dumps(loaded.tasks):
        task_id = str(dump["id"])
        if task_id not in known:
            max_seq += 1
            desc = new_descriptor(dump, max_seq)
            name = descriptor_name(int(dump.get("priority", 0)), max_seq, task_id)
            atomic_write_json(paths.state_dir("pending") / name, desc, durable=queue.durable)
            queue.push(name)
            added += 1
        elif known[task_id][0] is State.PENDING:
            name = known[task_id][1]
            desc = queue.read(State.PENDING, name) or {}
            desc["task"] = dump
            atomic_write_json(paths.state_dir("pending") / name, desc, durable=queue.durable)
    _, info = open_run(paths.root)
    info["fingerprint"] = spec_hash(loaded)
    info["config"] = _redact_tree(loaded.config.model_dump(mode="json"))
    atomic_write_json(paths.run_json, info)
    ledger.emit(Ev.REQUEUED, reason="config-change", added=added)
    return added


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
) -> RunReport:
    """Attach to the run, initialise (recover / reclaim), run the slots, write the outputs.

    ``mode``: ``run`` (a fresh run), ``resume`` (no other supervisor may be live; repairs
    everything) or ``work`` (joins live supervisors; reclaims only dead owners' tasks).
    """
    own_hold = hold is None  # resume / work: hold this run's GPUs now (same run never blocks)
    if hold is None:
        hold = GpuHold.acquire(_keys(setup.slots), run=str(paths.root), share=share_gpus)
    try:
        return _supervise(paths, setup, mode, output, retry_failed, new_config)
    finally:
        if own_hold:
            hold.release()


def _supervise(
    paths: RunPaths,
    setup: Setup,
    mode: str,
    output: Output,
    retry_failed: bool,
    new_config: LoadedConfig | None,
) -> RunReport:
    owner = owner_id()
    cfg = setup.supervisor_config(owner)
    recovered = None
    with attach(paths, exclusive_start=mode == "resume") as hold:
        ledger = Ledger(paths.events)
        queue = DirQueue(paths, on_corrupt=lambda name, why: _corrupt(ledger, name, why))
        try:
            if mode == "resume":
                recovered = recover(queue, ledger, retry_failed=retry_failed)
            reclaim_dead(queue, ledger, owner, lease_ttl=cfg.lease_ttl)
            if new_config is not None:
                apply_config(paths, queue, ledger, new_config)
            setup = replace(setup, slots=register_slots(paths, owner, setup.slots, cfg.lease_ttl))
            cfg = replace(cfg, slots=setup.slots)  # unique slot ids: homes, events, lanes
            run_preflight(
                paths,
                setup.slots,
                setup.preflight,
                cwd=setup.base_dir,
                isolate=setup.isolate,
                provisions=setup.provisions,
            )
            if setup.preflight:
                ledger.emit(Ev.PREFLIGHT, ok=True, slots=[s.label for s in setup.slots])
            write_owner_file(paths, owner, {"slots": [s.label for s in setup.slots]})
            hold.end_init()
            shown = _reporter(paths, queue, ledger, setup, output)
            sup = Supervisor(paths, queue, ledger, cfg)
            started = time.time()
            with on_stop_signals(lambda: sup.request_stop()), shown:
                try:
                    sup.run()
                    _, info = open_run(paths.root)  # a late Ctrl-C must not cut the summary
                    extra = {"quarantined": sup.quarantined, "stopped": sup.stopping.is_set()}
                    summary = write_outputs(paths, queue, info, (started, time.time()), extra)
                    ledger.emit(
                        Ev.AGGREGATED, counts=summary["counts"], complete=summary["complete"]
                    )
                    if setup.after_all and _all_ended(queue) and not sup.stopping.is_set():
                        _say(output, f"after_all: {setup.after_all}")
                        after = run_once(
                            paths, setup.after_all, cwd=setup.base_dir, stop=sup.stopping
                        )
                        if after is not None:
                            fields = {k: v for k, v in after.items() if k != "command"}
                            ledger.emit(Ev.AFTER_ALL, **fields)
                            summary["after_all"] = after
                            atomic_write_json(paths.summary_json, summary)
                except OSError as exc:
                    if not disk_full(exc):
                        raise
                    raise _after_disk_full(paths, queue, exc) from None
                if output.report:
                    _write_report(paths, queue, summary, info, output)
        finally:
            try:
                ledger.close()
            except OSError as exc:  # the journal's last fsync: the disk may be full
                if not disk_full(exc):
                    raise
    return RunReport(paths, summary, interrupted=sup.stopping.is_set(), recovered=recovered)


def _all_ended(queue: DirQueue) -> bool:
    counts = queue.counts()
    return counts[State.PENDING] == 0 and counts[State.RUNNING] == 0


def _reporter(
    paths: RunPaths, queue: DirQueue, ledger: Ledger, setup: Setup, output: Output
) -> AbstractContextManager[None]:
    """Subscribe the terminal output to the journal: a live table, lines, or nothing."""
    if output.quiet:
        return nullcontext()
    stream = output.stream or sys.stderr
    counts = queue.counts()
    if not (output.live and is_terminal(stream)):
        ledger.subscribe(PlainReporter(counts, stream))
        return nullcontext()
    from gpuswarm.ui.liveview import LiveView, SlotRow, ViewState, gpu_sampler, shown  # rich: here

    state = ViewState({s.value: n for s, n in counts.items()})
    for slot in setup.slots:
        state.slots[slot.label] = SlotRow()
    view = LiveView(
        state, paths.attempt_log, title=paths.root.name, gpu_stats=gpu_sampler(setup.slots)
    )
    ledger.subscribe(view)
    return shown(view)


def write_run_report(run_dir: Path) -> Path:
    """``gpuswarm report``: the outputs and the report of a run as it stands (live or not)."""
    paths, info = open_run(run_dir)
    queue = DirQueue(paths)
    if paths.summary_json.is_file() and not is_live(paths):
        summary = read_json(paths.summary_json)  # as its supervisor wrote it (wall time, ...)
    else:
        summary = write_outputs(paths, queue, info, None)
    counts = {s.value: n for s, n in queue.counts().items()}
    summary["state"] = run_state(paths, counts, is_live(paths))  # live, crashed, ...
    return write_report(paths, queue, summary, info)


def _write_report(
    paths: RunPaths, queue: DirQueue, summary: dict[str, Any], info: dict[str, Any], out: Output
) -> None:
    """report.html + timeline.png; a failure here is reported, never the run's failure."""
    try:
        write_report(paths, queue, summary, info)
    except Exception as exc:  # the results are written already; the report is a view of them
        _say(out, f"gpuswarm: could not write the report ({type(exc).__name__}: {exc})")


def _after_disk_full(paths: RunPaths, queue: DirQueue, exc: OSError) -> DiskFullError:
    """The run stopped on a full disk: write the outputs if they still fit, say what to do."""
    where = f" ({exc.filename})" if exc.filename else ""
    try:
        _, info = open_run(paths.root)
        write_outputs(paths, queue, info, None)
        wrote = "summary.json and results.tsv are written"
    except OSError:
        wrote = "summary.json and results.tsv could not be written"
    return DiskFullError(
        f"the disk is full: {exc.strerror}{where}; the run stopped, {wrote}, and the queue "
        f"is intact: free some space, then run: gpuswarm resume {paths.root}"
    )


def _corrupt(ledger: Ledger, name: str, reason: str) -> None:
    ledger.emit(Ev.CORRUPT, task=task_id_of(name), file=name, reason=reason)


def _say(output: Output, text: str) -> None:
    if not output.quiet:
        stream = output.stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()
