"""What a research loop's proposer agent spent (issue 34): each proposal's tokens and cost, read
from the CLI's usage record in what it printed (its preset's ``usage`` format), in the ledger's
``proposal`` event; ``research loop --budget-usd`` (``--budget-tokens``) ends the loop once
the proposals' known cost (tokens) reaches it (earlier loops' proposals count: the ledger says
what they spent)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping

from gpuswarm.agents.preset import AgentPreset
from gpuswarm.agents.pricing import AgentUsage, attempt_usage
from gpuswarm.agents.usage import parse_usage
from gpuswarm.config.budget import suggested_tokens, tokens_text
from gpuswarm.core.errors import BudgetSpentError
from gpuswarm.core.events import kind_of
from gpuswarm.research.entries import ProposalUsage
from gpuswarm.research.experiment import ExpPaths

FIELDS = ("tokens_in", "tokens_cached", "tokens_out", "cost_usd", "model", "usage_problem")


class ProposerSpend:
    """The proposals' spend so far (thread-safe: proposers run side by side)."""

    def __init__(
        self, paths: ExpPaths, budget_usd: float | None, budget_tokens: int | None = None
    ) -> None:
        self.budget_usd = budget_usd
        self.budget_tokens = budget_tokens  # --budget-tokens: in + out
        self._lock = threading.Lock()
        self._local = threading.local()
        self.usd = 0.0
        self.tokens = 0
        self.unknown = 0
        if budget_usd is not None or budget_tokens is not None:
            self._replay(paths)

    def _replay(self, paths: ExpPaths) -> None:
        try:
            lines = paths.ledger.read_bytes().splitlines()
        except OSError:
            return
        for raw in lines:
            if b'"proposal"' not in raw or b'"tokens_in"' not in raw:
                continue
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if isinstance(e, dict) and kind_of(e) == "proposal":
                self._count(_usage(e))

    def _count(self, fields: ProposalUsage) -> None:
        cost = fields.get("cost_usd")
        tin, tout = fields.get("tokens_in"), fields.get("tokens_out")
        with self._lock:
            self.tokens += (tin if isinstance(tin, int) else 0) + (
                tout if isinstance(tout, int) else 0
            )
            if isinstance(cost, int | float) and not isinstance(cost, bool):
                self.usd += float(cost)
            else:
                self.unknown += 1

    def add(self, preset: AgentPreset | None, stdout: str) -> None:
        """One agent run's output: its usage counted, kept for this thread's next event."""
        self._local.last = ProposalUsage()
        if preset is None or preset.usage is None:
            return
        usage = parse_usage(stdout, preset.usage)
        fields = _usage(attempt_usage(usage, AgentUsage(spec=preset.usage, model=preset.model)))
        self._local.last = fields
        if "tokens_in" in fields or "cost_usd" in fields:
            self._count(fields)

    def last(self) -> ProposalUsage:
        """The usage fields of this thread's last agent run (for its ``proposal`` event)."""
        out: ProposalUsage = getattr(self._local, "last", ProposalUsage())
        self._local.last = ProposalUsage()
        return out

    def check(self) -> None:
        """BudgetSpentError (exit 1) once the proposals' known cost reached ``--budget-usd``,
        or their tokens ``--budget-tokens``."""
        with self._lock:
            spent, tokens = self.usd, self.tokens
        if self.budget_usd is not None and spent >= self.budget_usd:
            raise BudgetSpentError(
                f"research budget spent: the proposer agent spent ${spent:.2f} of --budget-usd "
                f"${self.budget_usd:.2f}; raise it: research loop ... --budget-usd "
                f"{max(self.budget_usd * 1.6, spent * 1.25):.2f}"
            )
        if self.budget_tokens is not None and tokens >= self.budget_tokens:
            more = tokens_text(suggested_tokens(self.budget_tokens, tokens))
            raise BudgetSpentError(
                f"research budget spent: the proposer agent used {tokens} tokens of "
                f"--budget-tokens {tokens_text(self.budget_tokens)}; raise it: research loop ... "
                f"--budget-tokens {more}"
            )


def _usage(fields: Mapping[str, object]) -> ProposalUsage:
    """``attempt_usage``'s fields that it reported (None: not reported), in its order."""
    out: ProposalUsage = {}
    if isinstance(tin := fields.get("tokens_in"), int):
        out["tokens_in"] = tin
    if isinstance(cached := fields.get("tokens_cached"), int):
        out["tokens_cached"] = cached
    if isinstance(tout := fields.get("tokens_out"), int):
        out["tokens_out"] = tout
    if isinstance(cost := fields.get("cost_usd"), int | float):
        out["cost_usd"] = cost
    if isinstance(model := fields.get("model"), str):
        out["model"] = model
    if isinstance(problem := fields.get("usage_problem"), str):
        out["usage_problem"] = problem
    return out
