"""A run that must end by a given time (a Slurm allocation's end, issue 36).

``SupervisorConfig.claim_until`` (epoch seconds): a pending task whose ``timeout`` would run past
it is not claimed (it stays pending for the next allocation: ``gpuswarm resume``); a task
without a timeout is claimed (nothing says it cannot fit). ``stop_at``: the supervisor stops
warm then (running attempts are requeued, never counted against them), the stop's cause naming
the allocation's end. The engine sets both from the allocation (``exec.slurm``); the supervisor
knows only the numbers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpuswarm.core.models import State
from gpuswarm.store.queue import DirQueue

Accept = Callable[[str], bool] | None


class AllocationEnd:
    def __init__(
        self,
        queue: DirQueue,
        claim_until: float | None,
        stop_at: float | None,
        stop: Callable[[str], None],
    ) -> None:
        self.queue = queue
        self.claim_until = claim_until
        self.stop_at = stop_at
        self._stop = stop
        self.refused: set[str] = set()  # tasks left pending: their timeout does not fit
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def wrap(self, accept: Accept) -> Accept:
        """``accept`` that also refuses tasks whose timeout ends after ``claim_until``."""
        until = self.claim_until
        if until is None:
            return accept

        def fits(name: str) -> bool:
            desc = self.queue.read_desc(State.PENDING, name)
            timeout = desc.timeout if desc is not None else None
            if timeout is not None and time.time() + timeout > until:
                self.refused.add(name)
                return False
            return accept(name) if accept is not None else True

        return fits

    def start(self) -> None:
        if self.stop_at is None:
            return
        self._thread = threading.Thread(target=self._watch, name="allocation-end", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        assert self.stop_at is not None
        if not self._done.wait(max(0.0, self.stop_at - time.time())):
            when = time.strftime("%H:%M:%S", time.localtime(self.stop_at))
            self._stop(f"the allocation ends (stopped warm at {when})")

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(5)
