"""What a resume changes in a run's own record, under the run lock: a new config applied to its
unfinished tasks (``--allow-config-change``), a moved backend's settings (``resume
--ray-address``) and a raised budget (``--budget-usd`` / ``--budget-tokens``) in run.json."""

from __future__ import annotations

from gpuswarm.app.setup import Setup, redact_config
from gpuswarm.config.backends import plugin_of
from gpuswarm.config.commands import task_dumps
from gpuswarm.config.load import LoadedConfig, spec_hash
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.store import release
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.runinfo import RunRecord
from gpuswarm.store.runs import open_record, write_record
from gpuswarm.store.spool import stream


def check_config_change(
    paths: RunPaths, info: RunRecord, loaded: LoadedConfig, allow: bool
) -> None:
    """``resume --config``: a config other than the run's snapshot is applied only when asked
    (``--allow-config-change``); ConfigError otherwise."""
    if spec_hash(loaded) == info.fingerprint:
        return
    if not allow:
        raise ConfigError(
            f"{loaded.path}: the config differs from the snapshot this run was created with "
            f"({paths.run_json}); pass --allow-config-change to apply it to unfinished tasks, "
            "or resume without --config"
        )


def apply_config(paths: RunPaths, queue: DirQueue, ledger: Ledger, loaded: LoadedConfig) -> int:
    """Under the run lock: update pending tasks' specs and enqueue tasks the run lacks."""
    stream(paths, queue.push, ledger)  # a streamed enqueue cut short: its tasks are known first
    known, max_seq = queue.index()
    added = 0
    for dump in task_dumps(loaded.tasks):
        task_id = str(dump["id"])
        if task_id not in known:
            max_seq += 1
            release.submit(queue, dump, max_seq)  # blocked/ when it has prerequisites
            added += 1
        elif known[task_id][0] is State.PENDING:
            queue.update_pending(known[task_id][1], dump)
    _, info = open_record(paths.root)
    config = redact_config(loaded.config.model_dump(mode="json"), loaded.base_dir)
    write_record(paths, info.with_values(fingerprint=spec_hash(loaded), config=config))
    ledger.emit(Ev.REQUEUED, reason="config-change", added=added)
    release.settle_locked(queue, ledger)  # issue 35: added ones whose prerequisites ended
    return added


def remember_moved(paths: RunPaths, ledger: Ledger, setup: Setup) -> None:
    """A resume's backend options moved the run's backend (``resume --ray-address``: the
    cluster's new address): its settings go into run.json (under the run lock), so the next
    ``resume`` finds it without the flag, and the journal's ``slots`` event says so."""
    plugin, settings = plugin_of(setup.backend), setup.backend_settings
    if settings is None or plugin.resume_moved is None:
        return
    _, info = open_record(paths.root)
    before = info.config.get(plugin.name) or {}
    moved = plugin.resume_moved(settings, before)
    if moved is None:
        return
    now = settings.model_dump(mode="json", exclude_unset=True)
    write_record(paths, info.with_values(config={**info.config, plugin.name: {**before, **now}}))
    ledger.emit(Ev.SLOTS, **moved)


def remember_budget(paths: RunPaths, setup: Setup) -> None:
    """``resume --budget-usd`` / ``--budget-tokens``: the raised budget goes into run.json
    (under the run lock), so that the next ``resume`` keeps it."""
    _, info = open_record(paths.root)
    settings = info.settings.copy()
    if (usd := setup.settings.get("budget_usd")) is not None:
        settings["budget_usd"] = usd
    if (tokens := setup.settings.get("budget_tokens")) is not None:
        settings["budget_tokens"] = tokens
    if settings != info.settings:
        settings.setdefault("budget_on_exceed", "finish")
        write_record(paths, info.with_values(settings=settings))
