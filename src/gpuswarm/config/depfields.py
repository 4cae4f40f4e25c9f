"""The config fields of issue 35 (dependencies and groups), used by :mod:`.models`:
``after``-style reference lists, group names, ``groups: {NAME: {max_parallel, priority}}``."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gpuswarm.config.values import NonEmpty
from gpuswarm.config.yamlload import quote
from gpuswarm.core.paths import slugify

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _dep_list(value: object) -> object:
    """``after: build`` is ``after: [build]``."""
    return [value] if isinstance(value, str) else value


MAX_PREREQUISITES = 10_000  # prerequisites of one task (a group reference counts its tasks)
DepList = Annotated[
    list[Annotated[NonEmpty, Field(max_length=300)]],
    BeforeValidator(_dep_list),
    Field(max_length=MAX_PREREQUISITES),
]


def _group_name(value: str) -> str:
    if not _SAFE_NAME.match(value):
        raise ValueError(
            f"group {quote(value)} must be a plain name (letters, digits, '.', '_', '-'), "
            f"e.g. {quote(slugify(value))}"
        )
    return value


GroupName = Annotated[str, AfterValidator(_group_name)]


class GroupConfig(BaseModel):
    """``groups: {NAME: {max_parallel: 2, priority: 10}}`` (issue 35)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_parallel: int | None = Field(default=None, ge=1, le=1_000_000)  # running at once
    priority: int | None = Field(default=None, ge=-4999, le=4999)  # its tasks' default
