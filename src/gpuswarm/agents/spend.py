"""An agent attempt's spend as its ``finished`` event carries it (issue 34)."""

from __future__ import annotations

from typing import Any, TypedDict


class SpendFields(TypedDict, total=False):
    """The spend fields of a ``finished`` event (none of them: it reported no usage):
    ``tokens`` in + out, ``cost_usd`` (None: unknown, then ``cost_unknown`` is true)."""

    tokens: int
    cost_usd: float | None
    cost_unknown: bool


def event_fields(record: Any) -> SpendFields:
    """The ``finished`` event's spend fields of an attempt record (none: it reported no usage)."""
    tin = getattr(record, "tokens_in", None)
    cost = getattr(record, "cost_usd", None)
    if tin is None and cost is None and getattr(record, "usage_problem", None) is None:
        return {}
    tokens = (tin or 0) + (getattr(record, "tokens_out", None) or 0)
    out: SpendFields = {"tokens": tokens, "cost_usd": cost}
    if cost is None:
        out["cost_unknown"] = True
    return out
