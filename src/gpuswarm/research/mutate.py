"""Offline "mutate" proposer: perturb the numeric settings of editable files.

Needs no LLM: each proposal nudges one or two hyperparameters (learning rates, widths, batch
sizes, ...) by sensible factors and never repeats a variant already tried. Settings are found in
the forms real training scripts use: module-level assignments of any case (``lr = 6e-4``,
``N_LAYER = 4``), ``2**19``-style expressions, tuples of numbers (``betas = (0.9, 0.95)``, each
element on its own), numeric defaults of ``@dataclass`` fields and of ``add_argument`` calls.
What cannot matter is skipped where it can be told: a name used only inside ``print(...)``, an
assignment a later one overrides, and (see :class:`Selection`) names a config file or a
``--name=value`` argument of the command overrides (nanoGPT's configurator pattern).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import math
import re
import warnings
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from random import Random

_DUNDER = re.compile(r"^__.*__$")
_NEWLINE = re.compile(r"\r\n|\r|\n")
_FLOAT_FACTORS = (0.5, 0.67, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0)
_INT_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0)
_ZERO_FLOATS = ("1e-4", "1e-3", "0.01", "0.1")
_SINGLE_CHANGE_P = 0.7


@dataclass(frozen=True)
class Constant:
    """A numeric setting and where its literal (or expression) sits in the text.

    ``kind``: ``number`` (a literal), ``power`` (``2**19``: the exponent moves), ``expr``
    (arithmetic of numbers: replaced by a number). ``name`` is what ``--mutate`` matches:
    ``lr``, ``betas[1]`` (a tuple element), ``GPTConfig.n_layer``, ``--lr`` (argparse)."""

    path: str
    name: str
    literal: str
    value: float | int
    line: int
    start: int
    end: int
    kind: str = "number"


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

    def allows(self, c: Constant, print_only: bool) -> bool:
        """Whether ``c`` is a candidate; the reason it is not is noted in ``skipped``."""
        if self.exclude and self.matches(self.exclude, c):
            self.skipped[c.name] = "excluded"
            return False
        if self.include:  # named explicitly: the user knows it matters
            return self.matches(self.include, c)
        base = c.name.split("[")[0]
        if base in self.overridden and c.path not in self.config_files:
            self.skipped[c.name] = "overridden at run time (config file or --name=value)"
            return False
        if print_only:
            self.skipped[c.name] = "used only in print()"
            return False
        return True


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


def _power(node: ast.expr) -> bool:
    """``2**19``: int base and a positive int exponent (the exponent is what moves)."""
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Pow)
        and isinstance(_number(node.left), int)
        and isinstance(_number(node.right), int)
        and int(_number(node.right) or 0) >= 1
    )


def _arith(node: ast.expr) -> float | int | None:
    """The value of arithmetic on numbers only (``5 * 8``, ``1e-3 / 2``, ``2**19``)."""
    if (value := _number(node)) is not None:
        return value
    if not isinstance(node, ast.BinOp) or not isinstance(
        node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Pow)
    ):
        return None
    left, right = _arith(node.left), _arith(node.right)
    if left is None or right is None:
        return None
    try:
        if isinstance(node.op, ast.Pow):
            if abs(right) > 64:
                return None
            out: float | int = left**right
        elif isinstance(node.op, ast.Add):
            out = left + right
        elif isinstance(node.op, ast.Sub):
            out = left - right
        elif isinstance(node.op, ast.Mult):
            out = left * right
        elif isinstance(node.op, ast.Div):
            out = left / right
        else:
            out = left // right
    except (ArithmeticError, ValueError):
        return None
    if isinstance(out, complex) or not math.isfinite(out) or abs(out) > 1e18:
        return None
    return out


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for d in cls.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


class _Finder:
    def __init__(self, path: str, text: str) -> None:
        self.path, self.text = path, text
        self.starts = [0] + [m.end() for m in _NEWLINE.finditer(text)]
        self.lines = [
            text[a:b] for a, b in zip(self.starts, [*self.starts[1:], len(text)], strict=True)
        ]
        self.found: list[Constant] = []

    def span(self, node: ast.expr) -> tuple[int, int] | None:
        if node.end_lineno is None or node.end_col_offset is None:  # pragma: no cover
            return None
        start = _offset(self.lines, self.starts, node.lineno, node.col_offset)
        end = _offset(self.lines, self.starts, node.end_lineno, node.end_col_offset)
        return start, end

    def add(self, name: str, node: ast.expr) -> None:
        """``node`` as a setting called ``name`` (tuples: one per numeric element)."""
        if isinstance(node, (ast.Tuple, ast.List)):
            for i, elt in enumerate(node.elts):
                if not isinstance(elt, (ast.Tuple, ast.List)):
                    self.add(f"{name}[{i}]", elt)
            return
        if _power(node):
            assert isinstance(node, ast.BinOp)
            kind, value = "power", _arith(node)
        elif (value := _number(node)) is not None:
            kind = "number"
        else:
            kind, value = "expr", _arith(node)
        if value is None or (kind == "expr" and not isinstance(node, ast.BinOp)):
            return
        span = self.span(node)
        if span is None:
            return
        literal = self.text[span[0] : span[1]]
        self.found.append(Constant(self.path, name, literal, value, node.lineno, *span, kind))


def _target(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target, node = stmt.targets[0], stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        target, node = stmt.target, stmt.value
    else:
        return None
    if not isinstance(target, ast.Name) or _DUNDER.match(target.id):
        return None
    return target.id, node


def _parse(text: str) -> ast.Module | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _last_assignments(tree: ast.Module) -> dict[str, ast.stmt]:
    """Module-level name -> the statement that assigns it last (earlier ones are moot)."""
    last: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        got = _target(stmt)
        if got is not None:
            last[got[0]] = stmt
        elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for t in ast.walk(stmt):
                if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                    last[t.id] = stmt  # assigned again some other way
    return last


def constants(path: str, text: str) -> list[Constant]:
    """The numeric settings of ``text`` (see the module's doc); [] when it does not parse.
    Of a module-level name assigned more than once, only the last assignment counts."""
    tree = _parse(text)
    if tree is None:
        return []
    finder = _Finder(path, text)
    last = _last_assignments(tree)
    for stmt in tree.body:
        got = _target(stmt)
        if got is not None and last.get(got[0]) is stmt:
            finder.add(*got)
        if isinstance(stmt, ast.ClassDef) and _is_dataclass(stmt):
            for item in stmt.body:
                got = _target(item)
                if got is not None:
                    finder.add(f"{stmt.name}.{got[0]}", got[1])
    _argparse_defaults(tree, finder)
    return finder.found


def _argparse_defaults(tree: ast.Module, finder: _Finder) -> None:
    """``parser.add_argument("--lr", default=0.01)``: the default is a setting named --lr."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            for kw in node.keywords:
                if kw.arg == "default":
                    finder.add(node.args[0].value, kw.value)


def print_only(text: str) -> set[str]:
    """Module-level names read somewhere, but only inside ``print(...)`` calls: changing them
    cannot change what a run measures (e.g. a peak-FLOPS figure used in a progress line)."""
    tree = _parse(text)
    if tree is None:
        return set()
    inside: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "print"
        ):
            inside.update(id(n) for n in ast.walk(node))
    used: dict[str, bool] = {}  # name -> read only in prints so far
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used[node.id] = used.get(node.id, True) and id(node) in inside
    return {name for name, only in used.items() if only}


def command_overrides(command: str, tracked: Mapping[str, str]) -> tuple[set[str], set[str]]:
    """(names set at run time, config files) from a training command: ``--name=value``
    arguments, and the module-level names of tracked ``.py`` files given after the script
    (nanoGPT: ``python train.py config/train_shakespeare_char.py --batch_size=32``, executed
    into train.py's globals by its configurator)."""
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    names: set[str] = set()
    files: set[str] = set()
    scripts = [w for w in words if w.endswith(".py")]
    for word in words:
        m = re.match(r"^--([A-Za-z_][A-Za-z0-9_]*)=", word)
        if m:
            names.add(m.group(1))
    for word in scripts[1:]:
        rel = word[2:] if word.startswith("./") else word
        if rel in tracked:
            files.add(rel)
            tree = _parse(tracked[rel])
            for stmt in tree.body if tree is not None else []:
                got = _target(stmt)
                if got is not None:
                    names.add(got[0])
    return names, files


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


def _value_of(literal: str) -> float | int | None:
    tree = _parse(literal)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    return _arith(tree.body[0].value)


def _power_candidates(literal: str) -> list[str]:
    """``2**19`` -> ``2**18``, ``2**20`` (the spacing kept)."""
    m = re.fullmatch(r"\s*(\d+)(\s*\*\*\s*)(\d+)\s*", literal)
    if m is None:
        return []
    base, op, exp = m.group(1), m.group(2), int(m.group(3))
    return [f"{base}{op}{e}" for e in (exp - 1, exp + 1) if e >= 1]


def neighbours(c: Constant) -> list[str]:
    """Candidate new literals for ``c`` (deduplicated, never its current value)."""
    if c.kind == "power":
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
        if s not in out and _value_of(s) != c.value:
            out.append(s)
    return out


def candidates(
    files: Mapping[str, str], select: Selection | None = None
) -> list[tuple[Constant, list[str]]]:
    """The settings of ``files`` that may be mutated, with their new literals."""
    select = select or Selection()
    pool = []
    for path in sorted(files):
        quiet = print_only(files[path])
        for c in constants(path, files[path]):
            if select.allows(c, c.name.split("[")[0] in quiet) and (options := neighbours(c)):
                pool.append((c, options))
    return pool


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
