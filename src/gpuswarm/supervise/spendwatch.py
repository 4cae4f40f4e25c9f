"""``max_usd:`` while an attempt runs (issue 34), where its CLI reports usage as it goes.

Codex's ``exec --json`` prints a ``turn.completed`` event with the turn's usage after every
turn, and aider a ``Tokens: ... Cost: $...`` line after every message: their usage so far is in
the attempt's log while it runs. Claude Code and Gemini CLI print theirs once, at the end (so
``max_usd`` is checked when their attempt ends, by the judge). :class:`SpendWatch` is the
keeper's: once a tick, for each live attempt of a task with ``max_usd`` whose usage format
streams (:data:`STREAMING`), it reads the log's usage (a bounded tail, and only when the log
grew) and prices it as the judge will; once the spend so far exceeds ``max_usd``, the attempt
is stopped (TERM, grace, KILL), and the judge fails it with the reason (``the agent spent
$0.3, over the task's max_usd $0.25 (not retried)``): what the log says it spent is the same
then.
"""

from __future__ import annotations

from gpuswarm.agents.pricing import over_max_usd, usage_fields
from gpuswarm.supervise.context import LiveAttempt, Shared

STREAMING = frozenset({"codex-jsonl", "aider"})  # usage formats with a record per turn/message


def _size(live: LiveAttempt, run: Shared) -> int:
    try:
        return run.paths.attempt_log(live.task_id, live.attempt).lstat().st_size
    except OSError:
        return -1


class SpendWatch:
    """The running spend of one supervisor's live attempts (the keeper's thread only)."""

    def __init__(self, run: Shared) -> None:
        self.run = run
        self._sizes: dict[tuple[str, int], int] = {}  # the log size last priced
        self._stopped: set[tuple[str, int]] = set()

    def tick(self) -> None:
        seen: set[tuple[str, int]] = set()
        for live in list(self.run.live.values()):
            task = live.task
            if task.max_usd is None or task.usage is None or live.handle.done:
                continue
            if task.usage.spec.format not in STREAMING:
                continue
            key = (live.task_id, live.attempt)
            seen.add(key)
            size = _size(live, self.run)
            if key in self._stopped or size == self._sizes.get(key):
                continue
            self._sizes[key] = size
            log = self.run.paths.attempt_log(live.task_id, live.attempt)
            cost = usage_fields(log, task.usage).get("cost_usd")
            over = over_max_usd(task.max_usd, cost) if isinstance(cost, float) else None
            if over is not None:
                self._stopped.add(key)
                live.over_usd = over  # its end: judged (failed, not retried), not requeued
                live.handle.cancel()
                self.run.wakeup()  # the loop hands it to a waiter: TERM, grace, KILL
        for key in set(self._sizes) - seen:
            del self._sizes[key]
            self._stopped.discard(key)
