"""The Backend seam: what the supervisor, recovery and reclaim may ask of whatever runs attempts.

A backend turns a :class:`LaunchSpec` into a running attempt and hands back a :class:`Handle`;
the supervisor never sees a process, a container or an actor. Today there are two backends:
``local`` (sessions, pidfds, a child subreaper: :mod:`gpuswarm.exec.local`) and ``wrapped``
(the local primitives without a wake-up fd, so every attempt takes the waiter path; it keeps
that path tested). Backends are found by name through :func:`create_backend`, which imports
only the one asked for: docker or ray can be added without the supervisor importing them.

The records of the seam (:class:`LaunchSpec`, :class:`AttemptEnd`) are backend-neutral: each
backend classifies its attempts' ends into them (:class:`gpuswarm.core.models.EndKind`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from gpuswarm.core.models import EndKind

if TYPE_CHECKING:
    from gpuswarm.exec.sandbox import Provision

__all__ = [
    "AttemptEnd",
    "Backend",
    "BackendOptions",
    "Handle",
    "LaunchSpec",
    "Leftovers",
    "backend_names",
    "create_backend",
]


@dataclass(frozen=True)
class LaunchSpec:
    """What to run, where, and how long. ``env`` is the full environment."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log_path: Path
    timeout: float | None = None
    grace: float = 10.0
    token: str = ""  # a fresh uuid is used when empty


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


class Leftovers(NamedTuple):
    """What :meth:`Backend.end_leftovers` found of a dead owner and ended."""

    ids: list[int]  # what was found (pids for ``local``), named in the ``killed`` event
    tasks: frozenset[str]  # task ids whose attempt was still running (never judged done)
    killed: int  # how many were signalled


@dataclass(frozen=True)
class BackendOptions:
    """What every backend is built with."""

    max_log_bytes: int = 256 << 20  # each attempt's log is kept under this size
    scope: str = ""  # the run's token prefix: close() ends strays of this run only ("" = none)


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


class Backend(Protocol):
    """Runs attempts. One per supervisor (or per recovery); not shared between runs."""

    name: str
    caps_logs: bool  # it keeps each log under max_log_bytes itself (else the keeper caps them)

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

    def close(self) -> None:
        """After the last attempt ended: end this run's strays and stop what open() started."""


# -- the registry ----------------------------------------------------------------------------------
_BACKENDS: Mapping[str, str] = {
    "local": "gpuswarm.exec.local.backend:LocalBackend",
    "wrapped": "gpuswarm.exec.wrapped:WrappedBackend",
}


def backend_names() -> list[str]:
    """The names a config's ``backend:`` may take."""
    return sorted(_BACKENDS)


def create_backend(name: str, options: BackendOptions | None = None) -> Backend:
    """The backend called ``name``; its module is imported only now. KeyError when unknown."""
    module, _, cls = _BACKENDS[name].partition(":")
    factory = getattr(importlib.import_module(module), cls)
    backend: Backend = factory(options or BackendOptions())
    return backend
