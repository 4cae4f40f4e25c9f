"""run.json as a run is created: the one builder of its record.

Every run is made with one (``engine`` from a config, through :func:`gpuswarm.app.setup.run_info`;
``api.create_run`` for a client's run that has no tasks yet), so the keys, their order and their
defaults are written in one place. :func:`gpuswarm.store.runs.create_run` adds where the run was
put (``run_dir``) and when (``created``); what a resume reads back is read by ``app.setup``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict

from gpuswarm import __version__
from gpuswarm.core.errors import RunDirError
from gpuswarm.core.fsutil import read_json


@dataclass(frozen=True)
class RunInfo:
    """What run.json says of a run when it is made."""

    name: str  # the run's name (status, ls, the index)
    workspace: Path  # the run folder is under it
    source: str  # the config file (``<stdin>``), or the client that made the run
    base_dir: Path  # relative task paths start here
    gpus: str  # the --gpus spec the run was planned with
    vendor: str
    gpu_ids: Sequence[int]
    slot_count: int
    settings: Mapping[str, Any]  # lease_ttl, retry_backoff, breaker, log cap, halt, ...
    config: Mapping[str, Any]  # the config as recorded (redacted by the caller)
    fingerprint: str = ""  # the spec hash a resume compares (none for a client's run)
    gpus_per_task: int = 1
    tasks_per_gpu: int = 1
    isolate: bool = False  # home.isolate: each slot a private HOME
    provision: Sequence[Mapping[str, str]] = field(default_factory=list)  # {src, dest}
    task_count: int = 0

    def to_json(self) -> dict[str, Any]:
        """The record run.json holds (this version of gpuswarm, this host)."""
        return {
            "gpuswarm": __version__,
            "name": self.name,
            "workspace": str(self.workspace),
            "source": self.source,
            "base_dir": str(self.base_dir),
            "fingerprint": self.fingerprint,
            "gpus": self.gpus,
            "vendor": self.vendor,
            "gpu_ids": list(self.gpu_ids),
            "gpus_per_task": self.gpus_per_task,
            "tasks_per_gpu": self.tasks_per_gpu,
            "slot_count": self.slot_count,
            "home": {
                "isolate": self.isolate,
                "provision": [{"src": p["src"], "dest": p["dest"]} for p in self.provision],
            },
            "settings": dict(self.settings),
            "config": dict(self.config),
            "task_count": self.task_count,
            "hosts": [socket.gethostname()],
        }


# -- read back ---------------------------------------------------------------------------------
class Provisioned(TypedDict):
    """A file copied into each slot's HOME (``home.provision``)."""

    src: str
    dest: str


class RunHome(TypedDict, total=False):
    """run.json's ``home``: a private HOME per slot, and what is copied into it."""

    isolate: bool
    provision: list[Provisioned]


class RunSettings(TypedDict, total=False):
    """run.json's ``settings``: what a supervisor of the run is configured with (setup.py)."""

    lease_ttl: float
    retry_backoff: float
    breaker_failures: int
    breaker_window: float
    breaker_cooldown: float
    max_log_bytes: int
    gpu_share: int
    release_timeout: float
    halt: str | None
    budget_usd: float | None
    budget_tokens: int | None
    budget_on_exceed: str


# run.json's keys in the order the builder writes them (then create_run's two)
KEYS = (
    *("gpuswarm", "name", "workspace", "source", "base_dir", "fingerprint", "gpus", "vendor"),
    *("gpu_ids", "gpus_per_task", "tasks_per_gpu", "slot_count", "home", "settings", "config"),
    *("task_count", "hosts", "run_dir", "created"),
)
# the type of each key that is no string
_TYPES: dict[str, type] = {
    **dict.fromkeys(("gpus_per_task", "tasks_per_gpu", "slot_count", "task_count"), int),
    **dict.fromkeys(("gpu_ids", "hosts"), list),
    **dict.fromkeys(("home", "settings", "config"), dict),
}


def read_record(path: Path) -> RunRecord:
    """The run.json at ``path`` read back; RunDirError naming it when it cannot be."""
    try:
        raw = read_json(path)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable run snapshot ({exc})") from None
    return RunRecord.from_json(raw, str(path))


@dataclass(frozen=True)
class RunRecord:
    """run.json read back (:meth:`from_json`); :meth:`to_json` gives the same record again,
    keys it lacked still absent and keys this version does not know (``extra``) kept."""

    gpuswarm: str = ""  # the version that made the run
    name: str = ""
    workspace: str = ""
    source: str = ""
    base_dir: str = "."
    fingerprint: str = ""
    gpus: str = ""
    vendor: str = ""
    gpu_ids: tuple[int, ...] = ()
    gpus_per_task: int = 1
    tasks_per_gpu: int = 1
    slot_count: int = 1
    home: RunHome = field(default_factory=lambda: RunHome())
    settings: RunSettings = field(default_factory=lambda: RunSettings())
    config: dict[str, Any] = field(default_factory=dict)  # the config as recorded: any shape
    task_count: int = 0
    hosts: tuple[str, ...] = ()
    run_dir: str = ""  # the run folder's name
    created: str = ""  # ISO time of its creation
    extra: Mapping[str, object] = field(default_factory=dict)  # keys of another version
    absent: frozenset[str] = frozenset()  # known keys the file lacks (to_json leaves them out)

    @classmethod
    def from_json(cls, raw: object, where: str = "run.json") -> RunRecord:
        """The record of a parsed run.json; RunDirError naming ``where`` and the field when a
        known key has the wrong type (a value of null is kept as it is, among ``extra``)."""
        if not isinstance(raw, dict):
            raise RunDirError(f"{where}: not a JSON object")
        known: dict[str, Any] = {}
        for key in KEYS:
            value = raw.get(key)
            if value is not None:
                known[key] = _checked(key, value, where)
        extra = {k: v for k, v in raw.items() if k not in known}
        return cls(**known, extra=extra, absent=frozenset(KEYS) - known.keys())

    def to_json(self) -> dict[str, Any]:
        """run.json's record: its keys in the builder's order, then ``extra``."""
        out: dict[str, Any] = {}
        for key in KEYS:
            if key not in self.absent:
                value = getattr(self, key)
                out[key] = list(value) if isinstance(value, tuple) else value
        out.update(self.extra)
        return out

    def with_values(self, **values: Any) -> RunRecord:
        """This record with ``values`` set (present in :meth:`to_json` from now on)."""
        return replace(self, **values, absent=self.absent - values.keys())

    @property
    def backend(self) -> str:
        """The backend its attempts ran on (runs before backends: local)."""
        return str(self.config.get("backend") or "local")


def _checked(key: str, value: object, where: str) -> Any:
    """``value`` of run.json's ``key`` as the record holds it; RunDirError when it is not."""
    want = _TYPES.get(key, str)
    items = str if key == "hosts" else int
    if (
        not isinstance(value, want)
        or isinstance(value, bool)
        or (isinstance(value, list) and not all(_is(v, items) for v in value))
        or (key == "home" and not _home_ok(value))
    ):
        raise RunDirError(f"{where}: field {key!r} is not valid ({value!r:.80}); fix or restore it")
    return tuple(value) if isinstance(value, list) else value


def _is(value: object, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _home_ok(home: object) -> bool:
    if not isinstance(home, dict) or not isinstance(home.get("isolate", False), bool):
        return False
    provision = home.get("provision", [])
    return isinstance(provision, list) and all(
        isinstance(p, dict) and isinstance(p.get("src"), str) and isinstance(p.get("dest"), str)
        for p in provision
    )
