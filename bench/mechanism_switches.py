"""Benchmark-build switches: each turns one mechanism of the hot path off by monkeypatching.

Only ``bench/mechanism_child.py`` applies them, in its own process, to measure what a mechanism
costs per task (CPU with it on minus CPU with it off); gpuswarm itself has no setting, variable
or flag that turns any of them off. A run with a switch applied is no durable or safe run: its
numbers are the only thing it is for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Switch:
    name: str
    what: str  # the mechanism, in the table's words
    apply: Callable[[], None]


def _patch(owner: object, name: str, value: object) -> None:
    """Replace ``owner.name`` (a class, a module) for the rest of this process."""
    setattr(owner, name, value)


def _nothing() -> None:
    return None


def _no_pump() -> None:
    """The task writes straight into its log (O_APPEND): no pipe, no pump, no log keeper."""
    from gpuswarm.exec.local.backend import LocalBackend
    from gpuswarm.exec.local.process import Attempt

    def launch(self: LocalBackend, spec: Any) -> Attempt:
        return Attempt.launch(spec, pump=None)

    _patch(LocalBackend, "launch", launch)


def _no_keeper() -> None:
    """The pump without the log keeper process (no SCM_RIGHTS hand-over per attempt)."""
    from gpuswarm.exec.local.keeper import LogKeeper

    _patch(LogKeeper, "hold", lambda self, sink: None)
    _patch(LogKeeper, "release", lambda self, sink: None)


def _no_fencing() -> None:
    """A save under a lease is a plain temp + rename (no RENAME_EXCHANGE, no unlink after)."""
    from gpuswarm.store import moves

    real = vars(moves)["atomic_write_bytes"]

    def unfenced(*args: Any, **kwargs: Any) -> None:
        kwargs["fenced"] = False
        real(*args, **kwargs)

    _patch(moves, "atomic_write_bytes", unfenced)


def _no_fsync() -> None:
    """The queue's writes are not made durable (no fsync of descriptors, none of folders)."""
    from gpuswarm.core import fsutil
    from gpuswarm.store import holds, moves, queue, retries

    lazy = functools.partial(fsutil.atomic_write_bytes, durable=False)
    for module in (queue, moves, holds, retries):  # the queue and its mixins
        _patch(module, "atomic_write_bytes", lazy)
    _patch(fsutil.DirSyncer, "sync", lambda self, path: None)


def _no_redaction() -> None:
    """Journal lines are written without the run's redactor over their text fields."""
    from gpuswarm.store.ledger import Ledger

    real = Ledger.__init__

    def init(self: Ledger, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("redact", None)
        real(self, *args, **kwargs)

    _patch(Ledger, "__init__", init)


def _no_record_checks() -> None:
    """A claimed descriptor is taken as it reads (no field-type checks of the record)."""
    from gpuswarm.core.models import descriptor

    _patch(descriptor, "descriptor_problem", lambda obj, task_fields=True: None)


def _no_marker_stat() -> None:
    """A claim does not stat the ``added`` marker (tasks added to a live run go unseen)."""
    from gpuswarm.store.queue import DirQueue

    _patch(DirQueue, "_added_mark", lambda self: None)


def _no_journal() -> None:
    """No journal line is written (the events are still built and handed to listeners)."""
    import os

    from gpuswarm.store import ledger

    class _NoWrite:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def write(fd: int, data: bytes) -> int:
            return len(data)

    _patch(ledger, "os", _NoWrite())


def _no_leftover_scan() -> None:
    """An exited attempt is not checked for leftovers (children, its process group)."""
    from gpuswarm.exec.local.process import Attempt

    _patch(Attempt, "_claimed", lambda self: [])
    _patch(Attempt, "_group_alive", lambda self: False)


def _no_log_cap() -> None:
    """The committer does not check the log's size against ``max_log_mb``."""
    from gpuswarm.supervise import committer

    _patch(committer, "cap_log", lambda path, limit: 0)


def _no_task_check() -> None:
    """A claimed task's spec is not validated again (pydantic) before its launch."""
    from gpuswarm.config.models import TaskSpec
    from gpuswarm.supervise import launch

    class _Trusting:
        @staticmethod
        def model_validate(obj: Any) -> TaskSpec:
            return TaskSpec.model_construct(**obj)

    _patch(launch, "TaskSpec", _Trusting)


SWITCHES: dict[str, Switch] = {
    s.name: s
    for s in (
        Switch("none", "all mechanisms on (the reference)", _nothing),
        Switch(
            "pump", "log pipe + pump + log keeper (vs. the task writing its log itself)", _no_pump
        ),
        Switch("keeper", "log keeper hand-over (SCM_RIGHTS, 2 messages per attempt)", _no_keeper),
        Switch("fencing", "fencing (RENAME_EXCHANGE + unlink per save under a lease)", _no_fencing),
        Switch("fsync", "durability (fsync of each descriptor, folder fsyncs)", _no_fsync),
        Switch("journal", "journal lines (write(2) of 2 lines per task)", _no_journal),
        Switch("redaction", "redaction of the journal's text fields", _no_redaction),
        Switch("record_checks", "record checks of a claimed descriptor", _no_record_checks),
        Switch("marker_stat", "the claim's stat of the `added` marker", _no_marker_stat),
        Switch("task_check", "the claimed task's validation (pydantic)", _no_task_check),
        Switch(
            "leftover_scan",
            "leftover scan of an exited attempt (children, group)",
            _no_leftover_scan,
        ),
        Switch("log_cap", "log cap check at commit", _no_log_cap),
    )
}
