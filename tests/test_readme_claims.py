"""What the README says about the project's scope stays true to the code (issue 33)."""

from __future__ import annotations

import re
from pathlib import Path

from gpuswarm.exec.base import backend_names

README = Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert found, f"README has no section {title!r}"
    return " ".join(found.group(1).split())


def test_goals_say_several_machines_are_supported_through_ray() -> None:
    goals = _section("Goals and non-goals")
    assert "ray" in backend_names()  # the backend the section names exists
    assert "backend: ray" in goals and "docs/cluster.md" in goals
    assert not re.search(r"not \(yet\):[^.]*several machines", goals, re.I), goals
