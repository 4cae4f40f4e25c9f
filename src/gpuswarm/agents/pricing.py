"""What an attempt's tokens cost: the CLI's own figure, else the shipped price table.

``pricing.yaml`` (package data) gives USD per million tokens per model and token kind
(``input``, ``cached``, ``output``); a run's config adds or overrides models (``pricing:``).
A model that is in neither has an unknown cost: None and a note saying how to price it, never
0.0 (a bill is never shown smaller than it is).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gpuswarm.agents.usage import Usage, UsageSpec, read_log_usage

_DATE = re.compile(r"(?:[-@]\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")


class Price(BaseModel):
    """USD per million tokens of one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, le=1e4)
    cached: float | None = Field(default=None, ge=0, le=1e4)  # None: as input
    output: float = Field(ge=0, le=1e4)


def model_key(name: str) -> str:
    """``openai/gpt-5-2025-08-07`` -> ``gpt-5``; ``claude-opus-4-5[1m]`` -> ``claude-opus-4-5``."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"\[[^\]]*\]$", "", key)
    return _DATE.sub("", key)


@cache
def shipped_prices() -> dict[str, Price]:
    text = (resources.files("gpuswarm.agents") / "pricing.yaml").read_text()
    data = yaml.safe_load(text)
    return {model_key(k): Price.model_validate(v) for k, v in data["models"].items()}


def price_of(model: str | None, overrides: Mapping[str, Price] | None = None) -> Price | None:
    if model is None:
        return None
    key = model_key(model)
    for name, price in (overrides or {}).items():
        if model_key(name) == key:
            return price
    return shipped_prices().get(key)


def cost_of(
    usage: Usage, overrides: Mapping[str, Price] | None = None
) -> tuple[float | None, str | None]:
    """``(cost_usd, note)``: the CLI's cost where it gave one, else its tokens priced per model;
    ``(None, why)`` when a model has no price (or is not known)."""
    if usage.cost_usd is not None:
        return usage.cost_usd, None
    if usage.problem is not None:
        return None, usage.problem
    if not usage.parts:
        return None, "cost unknown: the CLI reported no tokens per model"
    total = 0.0
    for part in usage.parts:
        price = price_of(part.model, overrides)
        if price is None:
            what = f"model {part.model}" if part.model else "an unnamed model (set agent model:)"
            return None, f"cost unknown: no price for {what}; add it under pricing: in the config"
        cached = price.cached if price.cached is not None else price.input
        fresh = max(part.tokens_in - part.tokens_cached, 0)
        spent = fresh * price.input + part.tokens_cached * cached + part.tokens_out * price.output
        total += spent / 1e6
    return round(total, 6), None


class AgentUsage(BaseModel):
    """What a task with ``agent:`` carries to the judge of its attempts: how its CLI reports
    usage, the model it was told to use (Codex names none in its events) and the config's
    ``pricing:``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: UsageSpec
    model: str | None = None
    pricing: dict[str, Price] = Field(default_factory=dict)


def attempt_usage(log_usage: Usage | None, task: AgentUsage) -> dict[str, object]:
    """The attempt record's fields (``tokens_in`` ... ``usage_problem``) of what its log said."""
    if log_usage is None:
        return {"usage_problem": "no usage reported (the agent printed no usage record)"}
    if task.model is not None:  # what it was told to use names a part its output did not
        parts = tuple(p if p.model else replace(p, model=task.model) for p in log_usage.parts)
        log_usage = replace(log_usage, parts=parts)
    cost, note = cost_of(log_usage, task.pricing)
    model = log_usage.model or task.model
    return {
        "tokens_in": log_usage.tokens_in,
        "tokens_cached": log_usage.tokens_cached,
        "tokens_out": log_usage.tokens_out,
        "cost_usd": cost,
        "model": model,
        "usage_problem": note,
    }


def usage_fields(log: Path, task: AgentUsage) -> dict[str, object]:
    """The usage fields of the attempt whose log is ``log`` (read bounded, no link followed)."""
    return attempt_usage(read_log_usage(log, task.spec), task)


def over_max_usd(max_usd: float | None, cost: float | None) -> str | None:
    """The reason an attempt that spent ``cost`` fails under a task's ``max_usd`` (None: it
    does not)."""
    if max_usd is None or cost is None or cost <= max_usd:
        return None
    return f"the agent spent ${cost:.4g}, over the task's max_usd ${max_usd:.4g} (not retried)"
