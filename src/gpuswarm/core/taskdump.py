"""The JSON form of a task (``TaskSpec.model_dump(mode="json")``): what the queue stores as a
descriptor's ``task`` and what a command list's rows are filled into.

Every key is always present (a model dump has every field); config/models.py's ``TaskSpec`` is
the one model behind it (tests/test_taskdump.py checks they name the same keys).
"""

from __future__ import annotations

from typing import TypedDict


class PriceDump(TypedDict):
    """``agents.pricing.Price`` dumped: USD per million tokens of one model."""

    input: float
    cached: float | None
    output: float


class UsageSpecDump(TypedDict):
    """``agents.usage.UsageSpec`` dumped: how an agent's CLI reports what it spent."""

    format: str
    tokens_in: str | None
    tokens_cached: str | None
    tokens_out: str | None
    cost_usd: str | None
    model: str | None


class AgentUsageDump(TypedDict):
    """``agents.pricing.AgentUsage`` dumped (an agent task's ``usage``)."""

    spec: UsageSpecDump
    model: str | None
    pricing: dict[str, PriceDump]


class TaskDump(TypedDict):
    """One task as the queue stores it (``config.models.TaskSpec``'s fields, in its order)."""

    id: str
    name: str
    command: list[str] | str
    shell: bool
    cwd: str | None
    env: dict[str, str]
    timeout: float | None
    grace: float
    max_attempts: int
    priority: int
    gpus: int | None
    done_when: str | None
    metrics: dict[str, str]
    vars: dict[str, str]
    skip_exit_code: int | None
    skip_reason: str | None
    gpu_memory_mb: int | None
    accelerator: str | None
    usage: AgentUsageDump | None
    max_usd: float | None
    stall_after: float | None
    repeat_of: str | None
    repeat: int | None
    score: str | None
    passed: str | None
    after: list[str]
    after_any: list[str]
    after_failed: list[str]
    group: str | None
