"""The run's budget (``budget:`` / ``--budget-usd``, :mod:`gpuswarm.config.budget`): what its
agents' attempts spent, and the stop it asks for once that reaches the budget.

What counts: every attempt the committer records (done, failed, retried, put back), its known
``cost_usd`` and its tokens (in + out); a resume starts from what the journal says was spent
before. An attempt whose cost is unknown (no price for its model, a garbled usage record)
adds its tokens and no USD, and is reported (a ``budget`` event naming it, once).

The loop asks :meth:`Budget.may_claim` before each claim: while outcomes are not committed yet
it waits for them (one of them may cross the budget), so with one slot at $0.30 a task and
``usd: 1.00`` exactly 4 tasks start; with more slots what runs when it is crossed finishes
(``finish``) or is stopped and put back in the queue (``stop``, the warm stop a Ctrl-C takes).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from gpuswarm.config.budget import suggested_tokens, suggested_usd, tokens_text
from gpuswarm.core.events import Ev
from gpuswarm.core.models import AttemptRecord
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.spent import journal_spend

BUDGET = "budget"  # the reason pending tasks are left with


class Budget:
    """The limits and the spend so far (thread-safe: the committer calls :meth:`spent`)."""

    def __init__(
        self,
        usd: float | None,
        tokens: int | None,
        on_exceed: str,
        paths: RunPaths,
        ledger: Ledger,
        *,
        on_soon: Callable[[], None],
        on_now: Callable[[str], None],
    ) -> None:
        self.usd, self.tokens, self.on_exceed = usd, tokens, on_exceed
        self._paths, self._ledger = paths, ledger
        self._on_soon, self._on_now = on_soon, on_now
        self._lock = threading.Lock()
        self.spent_usd = 0.0
        self.spent_tokens = 0
        self.unknown = 0
        self.reason: str | None = None  # set once crossed: "budget: $1.20 spent of $1.00 ..."
        self.raise_to: float | None = None  # the --budget-usd the end line suggests
        self.how: str | None = None  # "raise it: gpuswarm resume RUN --budget-usd 1.6"
        if self.limited:
            before = journal_spend(paths.events, 0)  # a resume: what earlier sessions spent
            if before is not None:
                self.spent_usd = float(before["cost_usd"])
                self.spent_tokens = int(before["tokens"])
                self.unknown = int(before["cost_unknown_attempts"])
            self._check(notify=False)  # spent before: nothing is claimed (the loop asks)

    @property
    def limited(self) -> bool:
        return self.usd is not None or self.tokens is not None

    @property
    def draining(self) -> bool:
        """The budget is spent: no more claims."""
        return self.reason is not None

    def may_claim(self, uncommitted: int) -> bool:
        """Whether a free slot may claim now: the budget is not spent, and every outcome handed
        to the committer is committed (its cost may be what crosses it)."""
        if not self.limited:
            return True
        return self.reason is None and uncommitted == 0

    def spent(self, record: AttemptRecord) -> None:
        """An attempt was recorded: add what it spent; the stop when the budget is crossed."""
        if not self.limited:
            return
        tin, cost = record.tokens_in, record.cost_usd
        if tin is None and cost is None and record.usage_problem is None:
            return
        first = False
        with self._lock:
            self.spent_tokens += (tin or 0) + (record.tokens_out or 0)
            if cost is not None:
                self.spent_usd += cost
            else:
                self.unknown += 1
                first = self.unknown == 1
        if cost is None and first:
            why = record.usage_problem
            self._emit(reason=f"budget: an attempt's cost is unknown ({why}): its tokens count, "
                       "its USD cannot", crossed=False)  # fmt: skip
        self._check()

    def _check(self, *, notify: bool = True) -> None:
        with self._lock:
            if self.reason is not None:
                return
            over_usd = self.usd is not None and self.spent_usd >= self.usd
            over_tokens = self.tokens is not None and self.spent_tokens >= self.tokens
            if not (over_usd or over_tokens):
                return
            if over_usd:
                assert self.usd is not None
                self.raise_to = suggested_usd(self.usd, self.spent_usd)
                what = f"${self.spent_usd:.2f} spent of budget.usd ${self.usd:.2f}"
                how = f"--budget-usd {self.raise_to:g}"
            else:
                what = f"{self.spent_tokens} tokens spent of budget.tokens {self.tokens}"
                assert self.tokens is not None
                more = suggested_tokens(self.tokens, self.spent_tokens)
                how = f"--budget-tokens {tokens_text(more)}"
            self.reason = f"{BUDGET}: {what}"
            self.how = f"raise it: gpuswarm resume {self._paths.root} {how}"
        self._emit(reason=f"{self.reason}; {self.how}", crossed=True)
        if not notify:
            return
        if self.on_exceed == "stop":
            self._on_now(self.reason)
        else:
            self._on_soon()

    def _emit(self, **fields: object) -> None:
        with contextlib.suppress(OSError):  # a full disk must not keep the stop from happening
            self._ledger.emit(
                Ev.BUDGET,
                usd=self.usd,
                tokens=self.tokens,
                spent_usd=round(self.spent_usd, 6),
                spent_tokens=self.spent_tokens,
                unknown=self.unknown,
                on_exceed=self.on_exceed,
                **fields,
            )
