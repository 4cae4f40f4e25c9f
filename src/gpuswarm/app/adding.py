"""``gpuswarm add``: tasks appended to a run, live or stopped (:mod:`gpuswarm.app.control`'s
``add`` handler). The tasks are loaded (a YAML config, a command list, stdin), checked against
the run's slots, given ids the run has not used and seqs after its highest, then handed to the
queue as one batch (``DirQueue.add_batch``: hidden names, one sync, the ``added`` line naming the
batch, the renames); tasks with prerequisites go to blocked/ (issue 35, :mod:`.deps`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path

from gpuswarm.app import deps, replies
from gpuswarm.app.controlframe import Session, resume_hint
from gpuswarm.config.load import LoadedConfig, load_command_list, load_config, read_stdin
from gpuswarm.config.models import TaskOptions
from gpuswarm.core import verbs
from gpuswarm.core.errors import ConfigError
from gpuswarm.core.events import Ev
from gpuswarm.core.models import Descriptor
from gpuswarm.core.taskdump import TaskDump
from gpuswarm.store.leases import is_live
from gpuswarm.store.runinfo import RunRecord

YAML_SUFFIXES = (".yaml", ".yml")
SHOWN_IDS = 100  # ids an ``added`` event (and add's output) lists at most


def load_source(
    source: str, *, shell: bool, defaults: TaskOptions, known: Collection[str] = frozenset()
) -> LoadedConfig:
    """A YAML config (its ``tasks:``), a command list, or ``-`` (a command list on stdin).
    ``known``: the run's task ids, which the config's ``after:`` may name (issue 35)."""
    if source != "-" and Path(source).suffix in YAML_SUFFIXES:
        return load_config(Path(source), known=known)
    if source == "-":
        return load_command_list(
            None, read_stdin(), shell=shell, base_dir=Path.cwd(), defaults=defaults
        )
    return load_command_list(Path(source), shell=shell, base_dir=Path.cwd(), defaults=defaults)


def _check_fits(dumps: Iterable[TaskDump], info: RunRecord, source: str) -> None:
    per_task = info.gpus_per_task
    for dump in dumps:
        gpus = dump.get("gpus")
        if isinstance(gpus, int) and gpus > per_task:
            raise ConfigError(
                f"{source}: task {dump.get('id')!r}: gpus {gpus} is more than this run's "
                f"gpus_per_task ({per_task}); its slots hold {per_task} GPU(s) each: lower gpus"
            )


def add(s: Session, req: verbs.Add) -> replies.AddReply:
    """The ``add`` verb's handler."""
    dumps = [dump.copy() for dump in req.tasks]
    _check_fits(dumps, s.info, req.source)
    taken, max_seq = s.queue.ids_taken()
    renamed: dict[str, str] = {}
    added = deps.AddedDeps.of(req, s.paths, dumps, deps.fresh_ids(dumps, taken, deps.fresh_id))
    descs: list[Descriptor] = []
    for dump in dumps:
        original = str(dump["id"])
        tid = deps.fresh_id(original, taken)
        taken.add(tid)
        if tid != original:
            renamed[original] = tid
            dump["id"] = tid
        max_seq += 1
        descs.append(added.place(Descriptor.new(dump, max_seq)))  # blocked: issue 35
    ids = [desc.id for desc in descs]

    def journal(batch: str) -> None:  # names the batch: see DirQueue.finish_adds
        added.publish(s.paths)  # issue 35: edges known before the tasks are said or seen
        s.ledger.emit(
            Ev.ADDED, count=len(ids), ids=ids[:SHOWN_IDS], by=s.me, source=req.source,
            batch=batch, blocked=len(added.edges),  # issue 35: of them, waiting
        )  # fmt: skip
        s.ledger.sync()

    s.queue.add_batch(descs, journal)
    added.settle(s.queue, s.ledger)  # issue 35: after prerequisites that ended already
    live = is_live(s.paths)
    return {
        "run": str(s.paths.root),
        "added": len(ids),
        "ids": ids[:SHOWN_IDS],
        "renamed": dict(list(renamed.items())[:SHOWN_IDS]),
        "renamed_count": len(renamed),
        "live": live,
        "hint": "" if live else resume_hint(s.paths),
    }
