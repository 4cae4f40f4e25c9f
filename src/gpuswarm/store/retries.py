"""A failed or cancelled task back to pending/ with a fresh attempt budget (``gpuswarm retry``,
recovery's retries a crash cut short), part of :class:`gpuswarm.store.queue.DirQueue` (this is
its mixin): saved in its folder as a begun retry, journaled (the caller's ``announce``), renamed.

Layout (under ``RunPaths.parallel``)::

    <failed|cancelled>/.retry-<name>    a retry's save being written (then renamed over the task)
"""

from __future__ import annotations

import os

from gpuswarm.core.fsutil import atomic_write_bytes, dumps_compact
from gpuswarm.core.models import Descriptor, State, base_name
from gpuswarm.store.queuebase import Announce, QueueBase

RETRYABLE = (State.FAILED, State.CANCELLED)


class QueueRetries(QueueBase):
    """DirQueue's retries (see the module's doc)."""

    def retry_failed(self, name: str, announce: Announce) -> Descriptor | None:
        """A failed task back to pending/ with a fresh attempt budget (see :meth:`retry`)."""
        return self.retry(State.FAILED, name, announce)

    def retry(self, state: State, name: str, announce: Announce) -> Descriptor | None:
        """A failed or cancelled task back to pending/ with a fresh attempt budget (its history
        kept): save (in its folder, marked as a begun retry), ``announce`` (journal), rename.
        None when it is unreadable or gone (another retry took it)."""
        if state not in RETRYABLE:
            raise ValueError(f"retry from {state.value}: only failed or cancelled tasks")
        src = self.paths.state_dir(state.value) / name
        desc = self.read_desc(state, name)
        if desc is None:
            return None
        desc.fresh_budget()
        staged = src.parent / f".retry-{base_name(name)}"
        atomic_write_bytes(staged, dumps_compact(desc.raw), durable=self.durable)
        os.replace(staged, src)  # one retrier at a time: callers hold control_lock()
        self._finish_retry(state, name, desc, announce)
        return desc

    def finish_begun_retry(
        self, name: str, announce: Announce, state: State = State.FAILED
    ) -> bool:
        """A failed (cancelled) task saved as ``pending`` (a retry a crash cut short after its
        save): announce it again (the journal never lags behind the folders) and finish the
        rename."""
        desc = self.read_desc(state, name)
        if desc is None or desc.state != State.PENDING.value:
            return False
        self._finish_retry(state, name, desc, announce)
        return True

    def _finish_retry(self, state: State, name: str, desc: Descriptor, announce: Announce) -> None:
        announce(desc)
        os.rename(self.paths.state_dir(state.value) / name, self.paths.state_dir("pending") / name)
        self.push(name)
