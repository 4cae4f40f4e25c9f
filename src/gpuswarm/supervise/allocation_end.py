"""A run that must end by a given time (a Slurm allocation's end, issue 36): what it claims.

``SupervisorConfig.claim_until`` (epoch seconds): a pending task whose ``timeout`` would run past
it is not claimed (it stays pending for the next allocation: ``gpuswarm resume``); a task
without a timeout is claimed (nothing says it cannot fit). The engine sets it from the
allocation (``exec.slurm``), whose end also stops the run warm (slurmdriver.run_in_allocation:
the end signal, or ``stop_before`` seconds before the end); the supervisor knows only the number.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuswarm.core.models import State
from gpuswarm.store.queue import DirQueue

Accept = Callable[[str], bool] | None


class AllocationEnd:
    def __init__(self, queue: DirQueue, claim_until: float | None) -> None:
        self.queue = queue
        self.claim_until = claim_until
        self.refused: set[str] = set()  # tasks left pending: their timeout does not fit

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
