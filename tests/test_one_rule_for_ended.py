""" "Ended" is one rule, ``State.is_terminal()`` / ``State.terminal()`` (core/models/kinds.py): no
other module lists the ended states itself, where a state added later would be left out (three
such lists once, one of them without ``skipped``). Checked on the syntax trees."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuswarm.core.models import State

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpuswarm"
ENDED = {s.value for s in State.terminal()}


def _state_name(node: ast.expr) -> str | None:
    """``State.DONE``, ``State.DONE.value`` or ``"done"`` -> ``"done"``; else None."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "State"
    ):
        return node.attr.lower()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def ended_lists(tree: ast.AST) -> list[int]:
    """Lines of literal sets, tuples and lists of ended states only that name done, failed and
    one more (a list of what "ended" means; a named part of it, such as the states apart from
    the pass rates, is no such list)."""
    out: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Set | ast.Tuple | ast.List):
            names = [_state_name(e) for e in node.elts]
            if None in names or not names:
                continue
            found = set(names)
            if len(found) >= 3 and {"done", "failed"} <= found <= ENDED:
                out.append(node.lineno)
    return out


def test_no_module_lists_the_ended_states_itself() -> None:
    bad: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "models" and path.parent.parent.name == "core":
            continue
        lines = ended_lists(ast.parse(path.read_text(encoding="utf-8")))
        bad.extend(f"{path.relative_to(PACKAGE)}:{n}" for n in lines)
    assert not bad, "lists the ended states (use State.terminal() / is_terminal()): " + ", ".join(
        bad
    )


def test_the_check_sees_a_list_of_ended_states() -> None:
    listed = "E = frozenset({State.DONE, State.FAILED, State.CANCELLED})\n"
    listed += "V = ['done', 'skipped', 'failed']"
    assert sorted(ended_lists(ast.parse(listed))) == [1, 2]
    fine = "O = ('pending', 'running', 'done', 'failed', 'skipped')\nS = ('done', 'failed')\n"
    fine += "APART = (State.SKIPPED.value, State.CANCELLED.value, State.DEPENDENCY_FAILED.value)"
    assert ended_lists(ast.parse(fine)) == []
