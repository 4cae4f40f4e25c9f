"""RunPaths: the one authority on where every file of a run lives.

Nothing else in gpuswarm joins path strings for run files. Task ids are validated here so that a
task name can never escape the run directory.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path

from gpuswarm.core.errors import ConfigError, RunDirError

# cancelled/: issue 17; blocked/, dependency_failed/: issue 35 (tasks after prerequisites)
STATES = (
    *("pending", "running", "done", "failed", "skipped", "cancelled"),
    *("blocked", "dependency_failed"),
)
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SLOT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
RUN_PREFIX = "run_"
RAY_PROBE = "ray-probe"  # in .parallel/ (RunPaths.ray_probe)


def slugify(text: str, max_len: int = 100) -> str:
    """Turn any text into a safe task id: ``[A-Za-z0-9._-]``, no leading dot, bounded length."""
    slug = _UNSAFE.sub("-", text).strip("-.")
    slug = re.sub(r"-{2,}", "-", slug)[:max_len].strip("-.")
    return slug or "task"


_host: tuple[str, str] = ("", "")  # the last host name asked about, and its slug


def host_slug() -> str:
    """This machine's host name as slot ids and lease owners spell it (``<host>-gpu3``);
    asked of the system each time (it may change), slugged once per name (every attempt's
    record asks)."""
    global _host
    name = socket.gethostname()
    last = _host
    if last[0] == name and name:
        return last[1]
    slug = slugify(name, 60)
    _host = (name, slug)
    return slug


def check_task_id(task_id: str) -> str:
    """Return ``task_id`` if it is a safe file name, else raise :class:`ConfigError`."""
    if not _ID_RE.match(task_id) or task_id in (".", ".."):
        raise ConfigError(
            f"task id {task_id!r} is not allowed: use 1-128 characters of letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return task_id


@dataclass(frozen=True)
class RunPaths:
    """Every path of one run directory, as properties and small functions."""

    root: Path

    # -- run-level files -------------------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.root / "run.json"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def summary_json(self) -> Path:
        return self.root / "summary.json"

    @property
    def results_tsv(self) -> Path:
        return self.root / "results.tsv"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def timeline_png(self) -> Path:
        return self.root / "timeline.png"

    @property
    def ray_log(self) -> Path:
        """Ray's own messages to the driver (backend ray): a node's death, a raylet's end."""
        return self.root / "ray.log"

    @property
    def after_all_log(self) -> Path:
        """The after_all step's output (summary.json's ``after_all.log`` names it)."""
        return self.root / "after_all.log"

    @property
    def after_all_output(self) -> Path:
        """The after_all step's launch log (``after_all/output.log``), moved to
        :attr:`after_all_log` once it ends."""
        return self.root / "after_all" / "output.log"

    @property
    def preflight(self) -> Path:
        """``preflight/``: each slot's preflight log and its commands' own outputs."""
        return self.root / "preflight"

    def preflight_output(self, slot_name: str, i: int) -> Path:
        """Preflight command ``i``'s own output on a slot (its launch makes the folder)."""
        return self.preflight / slot_name / f"cmd-{i}" / "output.log"

    @cached_property  # (a per-task path's prefix: made once, not per call)
    def parallel(self) -> Path:
        return self.root / ".parallel"

    @property
    def notify_log(self) -> Path:
        """Issue 37: the journal of webhook deliveries (one JSON line per try)."""
        return self.root / ".parallel" / "notify.jsonl"

    @property
    def lock(self) -> Path:
        return self.parallel / "lock"

    @property
    def ray_probe(self) -> Path:
        """``.parallel/ray-probe`` (backend ray): a node that reads it back sees the run folder."""
        return self.parallel / RAY_PROBE

    @property
    def after_all_lock(self) -> Path:
        """``.parallel/after_all.lock``: supervisors that finish together run after_all once."""
        return self.parallel / "after_all.lock"

    @property
    def corrupt(self) -> Path:
        return self.parallel / "corrupt"

    @property
    def quarantine(self) -> Path:
        """``.parallel/quarantine/``: one file per slot a live supervisor took out of rotation."""
        return self.parallel / "quarantine"

    @property
    def live_lock(self) -> Path:
        """Shared by every live supervisor; ``resume`` needs it exclusively."""
        return self.parallel / "live"

    @property
    def owners(self) -> Path:
        return self.parallel / "owners"

    def owner_file(self, owner: str) -> Path:
        """``owners/<owner>``: a supervisor's heartbeat (its mtime) and its slots."""
        return self.owners / owner.replace(":", "_")

    @property
    def slots(self) -> Path:
        """``slots/<slot-id>``: every slot id the run has had, each naming its holder."""
        return self.parallel / "slots"

    def slot_file(self, slot_id: str) -> Path:
        """``slots/<slot-id>``: the registration of one slot id."""
        if not _SLOT_ID_RE.match(slot_id):
            raise ValueError(f"slot id {slot_id!r} is not a safe file name")
        return self.slots / slot_id

    @property
    def control(self) -> Path:
        """``.parallel/control/``: durable control requests (cancel) and pause flags."""
        return self.parallel / "control"

    @property
    def control_lock(self) -> Path:
        """``.parallel/control.lock``: the queue's control lock (one person's change at a time)."""
        return self.parallel / "control.lock"

    @property
    def edges(self) -> Path:
        """Issue 35: one line per task with prerequisites (the reverse index's source)."""
        return self.parallel / "edges.jsonl"

    @property
    def ended_marks(self) -> Path:
        """Issue 35: ``<task id>`` files saying how a prerequisite ended (its state)."""
        return self.parallel / "ended"

    @property
    def paused_groups(self) -> Path:
        """Issue 35: ``<group>`` files: that group's tasks start no more (``pause --group``)."""
        return self.parallel / "groups-paused"

    @property
    def added_marker(self) -> Path:
        """Touched when tasks are added, retried, reprioritized or unpaused: live supervisors'
        keepers stat it to wake their loops, their claims rescan pending/."""
        return self.parallel / "added"

    @property
    def enqueue_spool(self) -> Path:
        """``.parallel/enqueue.spool``: the tasks of a new run not yet in pending/ (a streamed
        enqueue, :mod:`gpuswarm.store.spool`); gone once every one of them is."""
        return self.parallel / "enqueue.spool"

    def state_dir(self, state: str) -> Path:
        if state not in STATES:
            raise ValueError(f"unknown queue state {state!r}")
        return self.parallel / state

    @cached_property
    def tasks(self) -> Path:
        return self.root / "tasks"

    @property
    def homes(self) -> Path:
        return self.root / "homes"

    # -- per task ----------------------------------------------------------------------------------
    def task_dir(self, task_id: str) -> Path:
        return self.tasks / check_task_id(task_id)

    def attempt_dir(self, task_id: str, attempt: int) -> Path:
        return self.task_dir(task_id) / f"attempt-{attempt}"

    def attempt_log(self, task_id: str, attempt: int) -> Path:
        return self.attempt_dir(task_id, attempt) / "output.log"

    def slot_home(self, slot_id: str) -> Path:
        """``homes/<slot-id>/``: one private HOME per slot id (unique within the run)."""
        if not _SLOT_ID_RE.match(slot_id):
            raise ValueError(f"slot id {slot_id!r} is not a safe folder name")
        return self.homes / slot_id

    # -- recognising runs --------------------------------------------------------------------------
    def is_run(self) -> bool:
        return self.run_json.is_file() and self.parallel.is_dir()

    def require_run(self) -> RunPaths:
        if not self.root.is_dir():
            raise RunDirError(f"{self.root}: no such run directory")
        if not self.is_run():
            raise RunDirError(
                f"{self.root}: not a gpuswarm run directory (no run.json or .parallel/); "
                "pass a folder named run_<timestamp> made by 'gpuswarm run'"
            )
        return self


def run_dir_name(now: datetime, suffix: str | None = None) -> str:
    """``run_<YYYYmmdd_HHMMSS>[_suffix]``; the suffix is slugified so it stays one path element."""
    name = RUN_PREFIX + now.strftime("%Y%m%d_%H%M%S")
    return f"{name}_{slugify(suffix)}" if suffix else name


def runs_in(parent: Path) -> list[Path]:
    """Run directories directly under ``parent`` (``<workspace>/<name>``), oldest first."""
    if not parent.is_dir():
        return []
    runs = [p for p in parent.iterdir() if p.name.startswith(RUN_PREFIX) and RunPaths(p).is_run()]
    return sorted(runs, key=lambda p: p.name)


def resolve_run_dir(arg: Path, workspace: Path = Path("runs")) -> Path:
    """The run folder meant by ``arg``: a run folder, any path inside one (``.../run.json``,
    ``.../tasks/x/attempt-1/output.log``), or a bare run name (``run_20260702_041903``, as
    AgentKernelArena takes it) looked up under ``workspace``. Anything else comes back as given
    (the caller's "no such run directory" names it)."""
    if arg.exists():
        here = arg.resolve()
        for folder in (here, *here.parents) if here.is_dir() else here.parents:
            if RunPaths(folder).is_run():
                return folder
        return arg
    if len(arg.parts) == 1 and arg.name.startswith(RUN_PREFIX):
        found = [r for r in find_runs(workspace) if r.name == arg.name]
        if len(found) > 1:
            listed = ", ".join(str(r) for r in found)
            raise RunDirError(f"{arg.name} names several runs ({listed}); pass the run folder")
        if found:
            return found[0]
        raise RunDirError(
            f"{arg}: no such run directory, and no run of that name under {workspace}; pass the "
            "run folder, or --workspace where runs are"
        )
    return arg


def find_runs(workspace: Path) -> list[Path]:
    """All runs under a workspace: ``<workspace>/<name>/run_*``, oldest first by folder name."""
    if not workspace.is_dir():
        return []
    found: list[Path] = []
    for name_dir in workspace.iterdir():
        if name_dir.is_dir():
            found.extend(runs_in(name_dir))
    found.extend(runs_in(workspace))
    return sorted(found, key=lambda p: (p.name, str(p)))
