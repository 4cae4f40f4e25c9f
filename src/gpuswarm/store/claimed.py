"""A claimed descriptor (a leaf: the queue and its group commit both speak of it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuswarm.core.models import Descriptor


@dataclass
class Claimed:
    """A descriptor this process holds in ``running/``."""

    name: str  # base name, no lease
    path: Path  # current path in running/
    data: dict[str, Any]  # the descriptor's JSON form: read it through ``desc``

    @property
    def desc(self) -> Descriptor:
        """The typed descriptor (a view over ``data``: what it changes is what is saved)."""
        return Descriptor(self.data)

    @property
    def task_id(self) -> str:
        return str(self.data["id"])
