"""Pending tasks taken out of the claimers' reach: a withdraw, and a person's cancel or priority
change (``gpuswarm cancel`` / ``priority``), part of :class:`gpuswarm.store.queue.DirQueue` (this
is its mixin). Each holds the task under a hidden name (a claim and that rename cannot both win),
then marks it, journals (the caller's ``announce``) and writes it where it goes; what a crash cut
short is finished or undone by :meth:`QueueHolds.finish_holds`.

Layout (under ``RunPaths.parallel``)::

    pending/.held-<op>-<pid>-<name>    a cancel / priority change / look in flight
    pending/.withdrawn-<name>          a task withdrawn this instant (then removed)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact, pid_alive
from gpuswarm.core.models import Descriptor, State
from gpuswarm.store.folders import visible
from gpuswarm.store.names import descriptor_name, task_id_of
from gpuswarm.store.queuebase import Announce, QueueBase, note_added

HELD = ".held-"  # pending/.held-<op>-<pid>-<name>: a task a person's change holds a moment


class QueueHolds(QueueBase):
    """DirQueue's transitions of held pending tasks (see the module's doc)."""

    def withdraw(self, task_id: str) -> bool:
        """Take a task out of pending/ before anyone claims it; False when it is not there
        (claimed meanwhile, or never queued). A claim and this rename cannot both win."""
        got = self._take(task_id, ".withdrawn-")
        if got is None:
            return False  # not there, or claimed this instant
        got[1].unlink()
        return True

    def _take(self, task_id: str, prefix: str) -> tuple[str, Path] | None:
        """Rename pending task ``task_id`` to ``pending/<prefix><name>``, out of the claimers'
        reach: (its name, where it is now); None when it is not pending (a claim and this
        rename cannot both win)."""
        pending = self.paths.state_dir("pending")
        for name in os.listdir(pending):
            if not visible(name) or task_id_of(name) != task_id:
                continue
            aside = pending / f"{prefix}{name}"
            try:
                os.rename(pending / name, aside)
            except FileNotFoundError:
                return None
            return name, aside
        return None

    def _hold(self, task_id: str, op: str) -> tuple[str, Path] | None:
        """Hold pending task ``task_id``: ``pending/.held-<op>-<pid>-<name>`` (see _take)."""
        return self._take(task_id, f"{HELD}{op}-{os.getpid()}-")

    def cancel_pending(self, task_id: str, reason: str, announce: Announce) -> Descriptor | None:
        """A pending task ends cancelled at once: held, marked, ``announce`` (journal),
        written to cancelled/, the hold removed. None when it is not pending (claimed
        meanwhile, or not there). A crash in between leaves the hold, which
        :meth:`finish_holds` completes (the journal says it, the folders follow)."""
        got = self._hold(task_id, "cancel")
        if got is None:
            return None
        name, held = got
        return self._cancel_held(name, held, Descriptor.loads(held.read_bytes()), reason, announce)

    def cancel_pending_if(
        self, task_id: str, decide: Callable[[Descriptor], str | None], announce: Announce
    ) -> Descriptor | None:
        """:meth:`cancel_pending` when ``decide(desc)`` gives a reason (a request that still
        applies to what the task is now); None: left pending as it was. The task is held as a
        look first (a crash then undoes the hold: :meth:`finish_holds`), as a cancel only once
        decided."""
        got = self._hold(task_id, "look")
        if got is None:
            return None
        name, held = got
        pending = self.paths.state_dir("pending")
        try:
            desc = Descriptor.loads(held.read_bytes())
            reason = decide(desc)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.replace(held, pending / name)
            raise
        cancel = pending / f"{HELD}cancel-{os.getpid()}-{name}"
        try:  # (FileNotFoundError: a finish_holds of this process undid the look meanwhile)
            os.replace(held, pending / name if reason is None else cancel)
        except FileNotFoundError:
            return None
        if reason is None:  # pending as it was
            self.push(name)
            note_added(self.paths)  # a claimer that met the hold dropped the name: rescan
            return None
        return self._cancel_held(name, cancel, desc, reason, announce)

    def _cancel_held(
        self, name: str, held: Path, desc: Descriptor, reason: str, announce: Announce
    ) -> Descriptor:
        desc.mark_cancelled(reason)
        announce(desc)
        self._write_ended(State.CANCELLED, name, desc)
        held.unlink()
        return desc

    def _write_ended(self, state: State, name: str, desc: Descriptor) -> None:
        folder = self.paths.state_dir(state.value)
        folder.mkdir(exist_ok=True)  # cancelled/ of a run made before it existed
        atomic_write_bytes(folder / name, dumps_compact(desc.raw), durable=self.durable)

    def reprioritize(self, task_id: str, priority: int, announce: Announce) -> str | None:
        """Pending task ``task_id`` gets ``priority`` (its name's rank: the claim order): held,
        changed, ``announce``, written under its new name, the hold removed. Returns the new
        name; None when it is not pending. Live supervisors see it at their next rescan."""
        got = self._hold(task_id, "prio")
        if got is None:
            return None
        _, held = got
        desc = Descriptor.loads(held.read_bytes())
        desc.set_priority(priority)
        new = descriptor_name(priority, desc.seq, task_id)
        announce(desc)
        atomic_write_bytes(
            self.paths.state_dir("pending") / new, dumps_compact(desc.raw), durable=self.durable
        )
        held.unlink()
        self.push(new)
        note_added(self.paths)  # live supervisors' heaps hold the old name: they rescan
        return new

    def finish_holds(self, announce_cancel: Announce) -> int:
        """Holds a crash cut short (their writer is dead): a cancel is finished (journaled
        again, written to cancelled/), a priority change or a cancel's look is undone (the
        task is pending under its old name). Returns how many were finished."""
        pending = self.paths.state_dir("pending")
        done = 0
        for held_name in os.listdir(pending):
            parsed = parse_hold(held_name)
            if parsed is None or (pid_alive(parsed[1]) and parsed[1] != os.getpid()):
                continue
            op, _, name = parsed
            held = pending / held_name
            try:
                desc = Descriptor.loads(held.read_bytes())
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:  # set aside where check reports it
                self.quarantine(held, f"unreadable: {exc}")
                continue
            ended = self.paths.state_dir(State.CANCELLED.value) / name
            if op == "cancel" and not ended.exists():
                desc.mark_cancelled(desc.reason or "cancelled")
                announce_cancel(desc)
                self._write_ended(State.CANCELLED, name, desc)
            elif op in ("prio", "look") and not any(
                task_id_of(n) == task_id_of(name) for n in os.listdir(pending) if visible(n)
            ):
                os.replace(held, pending / name)  # the change is undone: pending as it was
                self.push(name)
                done += 1
                continue
            held.unlink(missing_ok=True)
            done += 1
        return done


def parse_hold(file_name: str) -> tuple[str, int, str] | None:
    """``(op, pid, name)`` of a hold's file name; None for any other name."""
    if not file_name.startswith(HELD):
        return None
    op, _, rest = file_name[len(HELD) :].partition("-")
    pid, _, name = rest.partition("-")
    if op not in ("cancel", "prio", "look") or not pid.isdigit() or not name:
        return None
    return op, int(pid), name
