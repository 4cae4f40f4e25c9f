"""``budget:`` of a run and ``max_usd:`` of a task (issue 34): what its agents may spend.

``budget: {usd: 50, tokens: 20M, on_exceed: finish}``: once the run's attempts have spent
``usd`` (their known cost) or ``tokens`` (in + out), no task is claimed any more (the pending ones
stay pending, reason ``budget``); the running attempts finish (``finish``, the default) or are
stopped and put back in the queue (``stop``). ``gpuswarm resume RUN --budget-usd 80`` raises it.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

MAX_USD = 1e7
MAX_TOKENS = 10**15
_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGbB]?)\s*$")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
TOKENS_HELP = "a count of tokens: 500000, 500k, 20M or 1.5B"


def parse_tokens(value: object) -> int:
    """Tokens from ``20000000``, ``"20M"``, ``"500k"``, ``"1.5B"`` (decimal units)."""
    if isinstance(value, int) and not isinstance(value, bool):
        count = value
    elif isinstance(value, str) and (found := _TOKENS.match(value)) is not None:
        count = round(float(found.group(1)) * _UNITS[found.group(2).lower()])
    else:
        raise ValueError(f"{value!r} is not {TOKENS_HELP}")
    if not 0 < count <= MAX_TOKENS:
        raise ValueError(f"{value!r} is not {TOKENS_HELP} (above 0)")
    return count


def check_usd(value: object) -> float:
    """A positive amount in USD (``50``, ``0.5``); ValueError saying how otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not an amount in USD; write a number such as 50 or 2.5")
    if not (math.isfinite(value) and 0 < value <= MAX_USD):
        raise ValueError(f"{value!r} is not an amount in USD above 0")
    return float(value)


Usd = Annotated[float, BeforeValidator(check_usd)]
Tokens = Annotated[int, BeforeValidator(parse_tokens)]


class BudgetConfig(BaseModel):
    """``budget:`` of a run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    usd: Usd | None = None
    tokens: Tokens | None = None
    on_exceed: Literal["finish", "stop"] = "finish"

    @model_validator(mode="after")
    def _some(self) -> BudgetConfig:
        if self.usd is None and self.tokens is None:
            raise ValueError("budget needs usd: or tokens: (e.g. budget: {usd: 50, tokens: 20M})")
        return self


def suggested_usd(budget: float, spent: float) -> float:
    """The ``--budget-usd`` the end-of-run line suggests: 1.6x the budget, above what was spent
    (50 -> 80), as a round number."""
    want = max(budget * 1.6, spent * 1.25)
    if want >= 10:
        return float(math.ceil(round(want, 6)))
    return math.ceil(round(want * 100, 6)) / 100


def suggested_tokens(budget: int, spent: int) -> int:
    """The ``--budget-tokens`` the end-of-run line suggests: 1.6x the budget, above what was
    spent, rounded up to 2 significant digits (20M -> 32M)."""
    want = max(budget * 1.6, spent * 1.25)
    step = 10 ** max(0, len(str(math.ceil(want))) - 2)
    return int(math.ceil(want / step) * step)


def tokens_text(count: int) -> str:
    """``32M``, ``1.5k``, ``500``: a count as ``--budget-tokens`` takes it back exactly."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if count >= size and (count * 1000) % size == 0:
            return f"{count / size:g}{unit}"
    return str(count)
