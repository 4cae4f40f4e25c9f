"""Offline "mutate" proposer: perturb the numeric settings of editable files.

Needs no LLM: each proposal nudges one or two hyperparameters (learning rates, widths, batch
sizes, ...) by sensible factors and never repeats a variant already tried. The settings are
found by ``numeric.py`` (module-level assignments of any case, ``2**19``-style expressions,
tuples, ``@dataclass`` and ``add_argument`` defaults); what cannot matter is skipped where it
can be told: state, logging and the time budget (``knobs.py``), an assignment a later one
overrides, and (see :class:`Selection`) names a config file or a ``--name=value`` argument of
the command overrides (nanoGPT's configurator pattern). Values stay in their known ranges
(betas, dropout: [0, 1)); integers stay integers, sizes and rates keep their sign; attention
heads divide the model's width.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from random import Random

from gpuswarm.research import knobs
from gpuswarm.research.numeric import Constant, constants, parse, value_of

_FLOAT_FACTORS = (0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0)
_INT_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0)
_ZERO_FLOATS = ("1e-4", "1e-3", "0.01", "0.1")
_SINGLE_CHANGE_P = 0.7


@dataclass(frozen=True)
class Selection:
    """Which settings may be mutated: ``include`` (fnmatch patterns; empty = all found),
    ``exclude`` (patterns), ``overridden`` (names a config file or ``--name=value`` sets at run
    time, so changing them elsewhere cannot matter; ``config_files`` are where they are set)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    overridden: frozenset[str] = frozenset()
    config_files: frozenset[str] = frozenset()
    skipped: dict[str, str] = field(default_factory=dict, compare=False)  # name -> why

    def matches(self, patterns: tuple[str, ...], c: Constant) -> bool:
        names = {c.name, c.name.split("[")[0], c.name.rsplit(".", 1)[-1], c.name.lstrip("-")}
        return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names)

    def allows(self, c: Constant, not_knob: str | None) -> bool:
        """Whether ``c`` is a candidate (``not_knob``: why the script's code says it is no
        hyper-parameter); the reason it is not is noted in ``skipped``."""
        if self.exclude and self.matches(self.exclude, c):
            self.skipped[c.name] = "excluded"
            return False
        if self.include:  # named explicitly: the user knows it matters
            return self.matches(self.include, c)
        base = c.name.split("[")[0]
        if base in self.overridden and c.path not in self.config_files:
            self.skipped[c.name] = "overridden at run time (config file or --name=value)"
            return False
        if not_knob:
            self.skipped[c.name] = not_knob
            return False
        return True


@dataclass(frozen=True)
class Mutation:
    """A proposed variant: the changed files' new texts and what was changed."""

    files: dict[str, str]
    description: str
    changes: tuple[tuple[str, str, str], ...]


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
    if abs(v) >= 4:  # scaled steps: no +-1 nudges of a batch size of 24
        return [round(v * f) for f in _INT_FACTORS]
    if v == 0:
        return [1, 2]
    sign, a = (1 if v > 0 else -1), abs(v)
    return [sign * n for n in (a - 1, a + 1, a * 2, a + 2 if a == 1 else 0) if n > 0]


def _power_candidates(literal: str) -> list[str]:
    """``2**19`` -> ``2**18``, ``2**20`` (the spacing kept)."""
    m = re.fullmatch(r"\s*(\d+)(\s*\*\*\s*)(\d+)\s*", literal)
    if m is None:
        return []
    base, op, exp = m.group(1), m.group(2), int(m.group(3))
    return [f"{base}{op}{e}" for e in (exp - 1, exp + 1) if e >= 1]


def _unit_candidates(c: Constant, scientific: bool) -> list[str]:
    """A fraction in [0, 1) (a beta, a dropout): near 1 the distance to 1 moves (0.95 ->
    0.975, 0.933), else the value; never out of the range."""
    v = float(c.value)
    if v == 0:
        return list(_ZERO_FLOATS)
    if v >= 0.5:
        moved = [1 - (1 - v) * f for f in _FLOAT_FACTORS]
    else:
        moved = [v * f for f in _FLOAT_FACTORS]
    digits = max(3, len(f"{1 - v:.6g}") - 1) if v >= 0.5 else 3
    return [f"{x:.{digits}g}" if not scientific else _format_float(x, True) for x in moved]


def neighbours(c: Constant) -> list[str]:
    """Candidate new literals for ``c`` (deduplicated, never its current value, inside the
    range its name implies: ``knobs.bounds``)."""
    bounds = knobs.bounds(c.name)
    if bounds is not None and isinstance(c.value, float) and c.kind != "power":
        candidates = _unit_candidates(c, "e" in c.literal.lower())
    elif c.kind == "power":
        candidates = _power_candidates(c.literal)
    elif isinstance(c.value, float):
        if c.value == 0:
            candidates = list(_ZERO_FLOATS)
        else:
            scientific = "e" in c.literal.lower() or (
                c.kind == "expr" and not 1e-3 <= abs(c.value) < 1e6
            )
            scaled = [c.value * f for f in _FLOAT_FACTORS]
            candidates = [_format_float(x, scientific) for x in scaled if math.isfinite(x)]
            candidates = [s for s in candidates if float(s) != 0]
    else:
        candidates = [str(n) for n in _int_candidates(c.value)]
    out: list[str] = []
    for s in candidates:
        value = value_of(s)
        if s in out or value is None or value == c.value:
            continue
        if bounds is not None and not bounds[0] <= value < bounds[1]:
            continue
        out.append(s)
    return out


def candidates(
    files: Mapping[str, str], select: Selection | None = None
) -> list[tuple[Constant, list[str]]]:
    """The settings of ``files`` that may be mutated, with their new literals."""
    select = select or Selection()
    pool = []
    now = settings(files)
    for path in sorted(files):
        tree = parse(files[path])
        not_knobs = knobs.not_knobs(tree) if tree is not None else {}
        for c in constants(path, files[path]):
            why = not_knobs.get(c.name.split("[")[0])
            if not select.allows(c, why):
                continue
            fits = [s for s in neighbours(c) if knobs.heads_divide({**now, c.name: value_of(s)})]
            if fits:
                pool.append((c, fits))
    return pool


def settings(files: Mapping[str, str]) -> dict[str, object]:
    """Every numeric setting of ``files`` by name, with its value (the last assignment)."""
    return {c.name: c.value for path in sorted(files) for c in constants(path, files[path])}


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
    select: Selection | None = None,
) -> Mutation | None:
    """A variant of ``files`` with one or two constants perturbed whose digest is untried."""
    pool = candidates(files, select)
    if not pool:
        return None
    original = digest(files)
    names = [c.name for c, _ in pool]
    now = settings(files)
    for _ in range(attempts):
        k = 1
        if max_changes >= 2 and len(pool) >= 2 and rng.random() >= _SINGLE_CHANGE_P:
            k = rng.randint(2, min(max_changes, len(pool)))
        picks = [(c, rng.choice(options)) for c, options in rng.sample(pool, k)]
        if not knobs.heads_divide({**now, **{c.name: value_of(new) for c, new in picks}}):
            continue  # e.g. 12 heads of a width 960 -> 1000: the model would not build
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
