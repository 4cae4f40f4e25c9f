"""The Backend seam: what the supervisor, recovery and reclaim may ask of whatever runs attempts.

A backend turns a :class:`LaunchSpec` into a running attempt and hands back a :class:`Handle`;
the supervisor never sees a process, a container or an actor. ``local`` (sessions, pidfds, a
child subreaper: :mod:`gpuswarm.exec.local`) and ``wrapped`` (the local primitives without a
wake-up fd, so every attempt takes the waiter path; it keeps that path tested) are built in;
every other backend is a package that declares itself, its settings and its options in the
registry (:mod:`gpuswarm.config.backends`). Backends are made by name through
:func:`create_backend`, which imports only the one asked for.

The records of the seam (:class:`LaunchSpec`, :class:`AttemptEnd`) are backend-neutral: each
backend classifies its attempts' ends into them (:class:`gpuswarm.core.models.EndKind`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from gpuswarm.core.models import EndKind
from gpuswarm.placement.devices import Gpu, Vendor

if TYPE_CHECKING:
    from pydantic import BaseModel

    from gpuswarm.exec.sandbox import Provision
    from gpuswarm.placement.gpus import Slot

__all__ = [
    "Adopted",
    "AttemptEnd",
    "Backend",
    "BackendOptions",
    "Handle",
    "LaunchSpec",
    "Leftovers",
    "Membership",
    "SlotChanges",
    "backend_names",
    "create_backend",
    "membership_of",
]


@dataclass(frozen=True)
class LaunchSpec:
    """What to run, where, and how long. ``env`` is the full environment.

    The fields after ``token`` matter to a backend that runs attempts somewhere else than in
    this process's environment (a container): which GPUs to hand it, which folders it must see
    at the same paths, which variables were set for it, and what it is (for labels)."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    timeout: float | None = None
    grace: float = 10.0
    token: str = ""  # a fresh uuid is used when empty
    devices: tuple[Gpu, ...] = ()  # the attempt's GPUs, in order (its devices 0..k-1 inside)
    vendor: Vendor = Vendor.SIM
    binds: tuple[Path, ...] = ()  # host folders it must see at the same path (workspace, HOME)
    own_env: frozenset[str] = frozenset()  # names set for it (not inherited from the supervisor)
    identity: Mapping[str, str] = field(default_factory=dict)  # kind, task, attempt, slot


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended, classified once, with one human line in ``reason``."""

    kind: EndKind
    returncode: int | None
    signal: str | None
    reason: str
    oom: bool
    started: float
    ended: float
    pid: int | None
    killed: int

    @property
    def ok(self) -> bool:
        return self.kind is EndKind.EXITED and self.returncode == 0

    @property
    def duration(self) -> float:
        return self.ended - self.started


class EndFlags:
    """A handle's ``done`` and ``cancelled``, read alike by every backend: its end once known
    (``_end``) and a stop's mark (``_cancelled``), both set by the handle itself."""

    __slots__ = ()
    _end: AttemptEnd | None
    _cancelled: bool

    @property
    def done(self) -> bool:
        """True once its end is known (it ended, or it never started)."""
        return self._end is not None

    @property
    def cancelled(self) -> bool:
        """Whether a stop cancelled it (its end may still be an exit 0)."""
        return self._cancelled


class Leftovers(NamedTuple):
    """What :meth:`Backend.end_leftovers` found of a dead owner and ended."""

    ids: list[int | str]  # what was found (pids; container names), named in the ``killed`` event
    tasks: frozenset[str]  # task ids whose attempt was still running (never judged done)
    killed: int  # how many were signalled


@dataclass(frozen=True)
class BackendOptions:
    """What every backend is built with."""

    max_log_bytes: int = 256 << 20  # each attempt's log is kept under this size
    scope: str = ""  # the run's token prefix: close() ends strays of this run only ("" = none)
    run_dir: str = ""  # the run's folder (a container backend labels and masks by it)
    owner: str = ""  # the supervisor that runs the attempts ("" in recovery)
    settings: BaseModel | None = None  # the backend's own settings (its config block's model)
    base_dir: str = ""  # the config's folder: relative paths of its settings start here
    gpus_per_task: int = 1  # a backend that makes its own slots sizes them by these
    tasks_per_gpu: int = 1
    gpus: str | None = None  # ... and filters the cluster's GPUs by this (--gpus)


class Handle(Protocol):
    """One launched attempt. ``wait`` from one thread at a time; ``cancel`` from any thread
    (and from a signal handler). Once ``wait`` returns, nothing of the attempt runs."""

    @property
    def pid(self) -> int | None:
        """The attempt's main pid where it has one (journaled in ``started``); else None."""

    @property
    def done(self) -> bool:
        """True once its end is known (it ended, or it never started)."""

    @property
    def cancelled(self) -> bool:
        """Whether a stop cancelled it (its end may still be an exit 0)."""

    @property
    def exit_fd(self) -> int | None:
        """The wake-up fd: polls readable once the attempt's main process ends (a pidfd for
        ``local``). None: the backend has none; the supervisor then runs :meth:`wait` in a
        waiter thread."""

    @property
    def deadline(self) -> float | None:
        """When its timeout expires, on the ``time.monotonic`` clock (None: no timeout)."""

    def end_if_clean(self) -> AttemptEnd | None:
        """The non-blocking poll: the end once the attempt ended with nothing of it left;
        None while it runs, once a stop cancelled it, or while something of it is left (then
        :meth:`wait` finishes the job)."""

    def wait(self) -> AttemptEnd:
        """Block until the attempt ends; its timeout and a cancel end it (TERM, grace, KILL of
        everything of the attempt)."""

    def cancel(self, *, hard: bool = False) -> None:
        """Stop it: soft = TERM, grace, KILL (done by :meth:`wait`); hard = KILL now."""

    def pids(self) -> list[int]:
        """The host pids of the attempt's processes now: its process tree (local), its
        container's processes (docker); [] once it ended or where they cannot be known. From
        any thread; never blocks long. The VRAM sampler attributes GPU processes by them."""


class Backend(Protocol):
    """Runs attempts. One per supervisor (or per recovery); not shared between runs."""

    name: str
    caps_logs: bool  # it keeps each log under max_log_bytes itself (else the keeper caps them)

    def check(self) -> None:
        """Before anything is claimed or created: raise a BadInputError (exit 2) with the fix
        when no attempt could run at all (docker: the daemon is unreachable, the image absent)."""

    def open(self) -> None:
        """Process-wide set-up before the first launch (a subreaper, a log pump). Idempotent."""

    def prepare_slot(self, home: Path | None, provisions: Sequence[Provision]) -> dict[str, str]:
        """Make a slot's private home (``home`` None: none) and return the variables that go
        over the base environment of its attempts."""

    def launch(self, spec: LaunchSpec) -> Handle:
        """Start ``spec``; a command that cannot start gives a handle that is ``done``."""

    def end_leftovers(
        self, *, run_dir: str | None = None, owner: str | None = None, grace: float = 10.0
    ) -> Leftovers:
        """After a crash: end whatever still runs of the attempts of run ``run_dir`` (resume)
        or of supervisor ``owner`` (a reclaim), TERM, ``grace``, KILL. Exactly one is given."""

    def leftovers(self, run_dir: str) -> list[int | str]:
        """What of run ``run_dir``'s attempts is still there (pids, containers): ``check``."""

    def close(self) -> None:
        """After the last attempt ended: end this run's strays and stop what open() started."""


# -- slots a backend makes itself (issue 16: a cluster whose nodes come and go) -------------------
@dataclass(frozen=True)
class Adopted:
    """An attempt a dead supervisor started that still runs (or ended unseen) where the backend
    can reach it: the new supervisor waits for it instead of re-running its task."""

    task_id: str
    attempt: int
    slot: Slot
    handle: Handle


@dataclass
class SlotChanges:
    """What changed in a backend's slots since it was last asked."""

    added: list[Slot] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)  # slot labels (their node left)
    adopted: list[Adopted] = field(default_factory=list)
    notes: list[dict[str, object]] = field(default_factory=list)  # journaled as ``slots``
    # the backend cannot go on (a cluster whose head is gone): the run stops warm, its
    # in-flight attempts end ``lost`` and go back to the queue, `resume` goes on from there
    fatal: str | None = None

    def __bool__(self) -> bool:
        return bool(self.added or self.retired or self.adopted or self.notes or self.fatal)


class Membership(Protocol):
    """A backend whose slots are its own (a cluster's GPUs), not planned from ``--gpus``."""

    def initial_slots(self) -> list[Slot]:
        """The slots there are now (blocks until they can take attempts)."""

    def watch(self, wakeup: Callable[[], None]) -> None:
        """Start noticing changes; ``wakeup`` is called (from any thread) when there are some."""

    def changes(self) -> SlotChanges:
        """What changed since the last call (non-blocking; the slot loop's thread)."""


def membership_of(backend: object) -> Membership | None:
    """The backend's membership when its slots are its own (ray); None for local and docker,
    whose slots are planned from ``--gpus`` once."""
    found = getattr(backend, "membership", None)
    return found if found is not None else None


# -- the registry ----------------------------------------------------------------------------------
def backend_names() -> list[str]:
    """The names a config's ``backend:`` may take (the registry's)."""
    from gpuswarm.config.backends import backend_names as names  # pydantic: only when asked

    return names()


def create_backend(name: str, options: BackendOptions | None = None) -> Backend:
    """The backend called ``name``; its module is imported only now. KeyError when unknown."""
    from gpuswarm.config.backends import plugin_of  # the declarations: only when asked

    module, _, cls = plugin_of(name).factory.partition(":")
    factory = getattr(importlib.import_module(module), cls)
    backend: Backend = factory(options or BackendOptions())
    return backend
