"""What a supervised run ended as (:class:`RunReport`): its folder, its summary.json and the
exit code they mean."""

from __future__ import annotations

from dataclasses import dataclass

from gpuswarm.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNFINISHED
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.outputs.summaryjson import RunSummary


@dataclass
class RunReport:
    """What a supervised run ended as: its folder, summary.json, and the exit code it means."""

    paths: RunPaths
    summary: RunSummary
    interrupted: bool
    recovered: dict[str, int] | None = None
    strict: bool = False  # --strict: a cancelled task makes the exit code 1
    stopped_by: str | None = None  # the backend stopped it (its cluster's head is gone)
    halted: str | None = None  # the halt rule stopped it (issue 28): its reason
    budget: str | None = None  # the budget was spent (issue 34): its reason, how to raise it

    @property
    def exit_code(self) -> int:
        if self.halted:  # tasks are left: 1 when one failed (a fail= halt), 0 when the
            failed = (self.summary.get("counts") or {}).get(State.FAILED.value, 0)
            return EXIT_UNFINISHED if failed else EXIT_OK  # halt found what it waited for
        if self.stopped_by:
            return EXIT_UNFINISHED  # no one interrupted it: unfinished, `resume` goes on
        if self.budget and not self.summary.get("complete"):
            return EXIT_UNFINISHED  # issue 34: tasks left pending (reason budget)
        if self.interrupted:
            return EXIT_INTERRUPTED
        after = self.summary.get("after_all")
        if isinstance(after, dict) and not after.get("ok"):
            return EXIT_UNFINISHED  # the post-processing step failed
        if not self.summary.get("complete"):
            return EXIT_UNFINISHED
        cancelled = (self.summary.get("counts") or {}).get(State.CANCELLED.value, 0)
        return EXIT_UNFINISHED if self.strict and cancelled else EXIT_OK
