"""Offline "mutate" proposer: perturb UPPER_CASE numeric constants of editable files.

Needs no LLM: each proposal nudges one or two module-level hyperparameters (learning rates,
widths, batch sizes, ...) by sensible factors and never repeats a variant already tried.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
import warnings
from collections.abc import Container, Mapping
from dataclasses import dataclass
from decimal import Decimal
from random import Random

_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
_NEWLINE = re.compile(r"\r\n|\r|\n")
_FLOAT_FACTORS = (0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0)
_INT_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0)
_ZERO_FLOATS = ("1e-4", "1e-3", "0.01", "0.1")
_SINGLE_CHANGE_P = 0.7


@dataclass(frozen=True)
class Constant:
    """A top-level ``NAME = <number>`` assignment and where its literal sits in the text."""

    path: str
    name: str
    literal: str
    value: float | int
    line: int
    start: int
    end: int


@dataclass(frozen=True)
class Mutation:
    """A proposed variant: the changed files' new texts and what was changed."""

    files: dict[str, str]
    description: str
    changes: tuple[tuple[str, str, str], ...]


def _number(node: ast.expr) -> float | int | None:
    """The value of an int/float literal, optionally negated; None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand) if isinstance(node.operand, ast.Constant) else None
        return None if inner is None else -inner
    value = node.value if isinstance(node, ast.Constant) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _offset(lines: list[str], starts: list[int], lineno: int, col: int) -> int:
    """Character offset of an ast (1-based line, UTF-8 byte column) position."""
    line = lines[lineno - 1]
    return starts[lineno - 1] + len(line.encode("utf-8")[:col].decode("utf-8", "replace"))


def constants(path: str, text: str) -> list[Constant]:
    """Module-level UPPER_CASE int/float constants of ``text``; [] when it does not parse."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]
    lines = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    found: list[Constant] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, node = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, node = stmt.target, stmt.value
        else:
            continue
        value = _number(node)
        if not isinstance(target, ast.Name) or not _NAME.match(target.id) or value is None:
            continue
        if node.end_lineno is None or node.end_col_offset is None:  # pragma: no cover
            continue
        start = _offset(lines, starts, node.lineno, node.col_offset)
        end = _offset(lines, starts, node.end_lineno, node.end_col_offset)
        found.append(Constant(path, target.id, text[start:end], value, node.lineno, start, end))
    return found


def digest(files: Mapping[str, str]) -> str:
    """Stable sha256 over the sorted (path, text) pairs."""
    h = hashlib.sha256()
    for path in sorted(files):
        for part in (path.encode("utf-8"), files[path].encode("utf-8")):
            h.update(b"%d:" % len(part))
            h.update(part)
    return h.hexdigest()


def _format_float(x: float, scientific: bool) -> str:
    """``x`` rounded to 3 significant digits, without float noise."""
    if scientific:
        mantissa, exponent = f"{x:.2e}".split("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exponent)}"
    text = format(Decimal(repr(float(f"{x:.3g}"))), "f")
    return text if "." in text else text + ".0"


def _int_candidates(v: int) -> list[int]:
    """Neighbouring ints of ``v`` that keep its sign."""
    if v >= 8 and v & (v - 1) == 0:
        near = [v * 3 // 4, v * 3 // 2]
        if v >= 16:
            near = [max(8, 8 * round(v * f / 8)) for f in (0.75, 1.5)]
        return [v // 2, v * 2, *near]
    if abs(v) >= 4:
        return [round(v * f) for f in _INT_FACTORS] + [v - 1, v + 1]
    if v == 0:
        return [1, 2]
    sign, a = (1 if v > 0 else -1), abs(v)
    return [sign * n for n in (a - 1, a + 1, a * 2, a + 2 if a == 1 else 0) if n > 0]


def neighbours(c: Constant) -> list[str]:
    """Candidate new literals for ``c`` (deduplicated, never its current value)."""
    if isinstance(c.value, float):
        if c.value == 0:
            candidates = list(_ZERO_FLOATS)
        else:
            scientific = "e" in c.literal.lower()
            scaled = [c.value * f for f in _FLOAT_FACTORS]
            candidates = [_format_float(x, scientific) for x in scaled if math.isfinite(x)]
            candidates = [s for s in candidates if float(s) != 0]
    else:
        candidates = [str(n) for n in _int_candidates(c.value)]
    out: list[str] = []
    for s in candidates:
        if s not in out and float(s) != c.value:
            out.append(s)
    return out


def _apply(files: Mapping[str, str], picks: list[tuple[Constant, str]]) -> dict[str, str]:
    """The new texts of the files touched by ``picks`` (constant, new literal)."""
    changed: dict[str, str] = {}
    for c, new in sorted(picks, key=lambda p: (p[0].path, -p[0].start)):
        text = changed.get(c.path, files[c.path])
        changed[c.path] = text[: c.start] + new + text[c.end :]
    return changed


def propose(
    files: Mapping[str, str],
    rng: Random,
    tried: Container[str],
    *,
    max_changes: int = 2,
    attempts: int = 500,
) -> Mutation | None:
    """A variant of ``files`` with one or two constants perturbed whose digest is untried."""
    pool = [
        (c, options)
        for path in sorted(files)
        for c in constants(path, files[path])
        if (options := neighbours(c))
    ]
    if not pool:
        return None
    original = digest(files)
    names = [c.name for c, _ in pool]
    for _ in range(attempts):
        k = 1
        if max_changes >= 2 and len(pool) >= 2 and rng.random() >= _SINGLE_CHANGE_P:
            k = rng.randint(2, min(max_changes, len(pool)))
        picks = [(c, rng.choice(options)) for c, options in rng.sample(pool, k)]
        changed = _apply(files, picks)
        key = digest({**files, **changed})
        if key == original or key in tried:
            continue
        picks.sort(key=lambda p: (p[0].path, p[0].start))
        labels = [c.name if names.count(c.name) == 1 else f"{c.path}:{c.name}" for c, _ in picks]
        return Mutation(
            files=changed,
            description=", ".join(
                f"{label} {c.literal} -> {new}"
                for label, (c, new) in zip(labels, picks, strict=True)
            ),
            changes=tuple((c.name, c.literal, new) for c, new in picks),
        )
    return None
