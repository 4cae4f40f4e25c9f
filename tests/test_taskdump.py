"""TaskDump (core/taskdump.py) names exactly TaskSpec's fields: the dump of a spec has its keys."""

from __future__ import annotations

from gpuswarm.agents.pricing import AgentUsage, Price
from gpuswarm.agents.usage import UsageSpec
from gpuswarm.config.models import TaskSpec, task_dump
from gpuswarm.core.taskdump import AgentUsageDump, PriceDump, TaskDump, UsageSpecDump


def test_task_dump_keys_are_task_spec_fields() -> None:
    assert list(TaskDump.__annotations__) == list(TaskSpec.model_fields)
    assert set(TaskDump.__required_keys__) == set(TaskSpec.model_fields)


def test_nested_dumps_match_their_models() -> None:
    assert list(AgentUsageDump.__annotations__) == list(AgentUsage.model_fields)
    assert list(UsageSpecDump.__annotations__) == list(UsageSpec.model_fields)
    assert list(PriceDump.__annotations__) == list(Price.model_fields)


def test_task_dump_is_the_json_model_dump() -> None:
    spec = TaskSpec(id="a", name="a", command=["echo", "hi"], env={"K": "v"}, after=["b"])
    dump = task_dump(spec)
    assert dump == spec.model_dump(mode="json")
    assert set(dump) == set(TaskDump.__annotations__)
