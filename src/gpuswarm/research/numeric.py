"""Finding the numeric settings of source files, in the forms real training scripts use:
module-level assignments of any case, ``2**19``-style expressions, tuples of numbers, numeric
defaults of ``@dataclass`` fields and ``add_argument`` calls; and telling which cannot matter
(overridden by a later assignment, by a config file or a ``--name=value`` argument of the
command; ``knobs.py`` tells state, logging and the time budget apart). ``mutate.py``
perturbs what is found here."""

from __future__ import annotations

import ast
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

_DUNDER = re.compile(r"^__.*__$")
_NEWLINE = re.compile(r"\r\n|\r|\n")


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


def arith(node: ast.expr) -> float | int | None:
    """The value of arithmetic on numbers only (``5 * 8``, ``1e-3 / 2``, ``2**19``)."""
    if (value := _number(node)) is not None:
        return value
    if not isinstance(node, ast.BinOp) or not isinstance(
        node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Pow)
    ):
        return None
    left, right = arith(node.left), arith(node.right)
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
            kind, value = "power", arith(node)
        elif (value := _number(node)) is not None:
            kind = "number"
        else:
            kind, value = "expr", arith(node)
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


def parse(text: str) -> ast.Module | None:
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
    tree = parse(text)
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
            tree = parse(tracked[rel])
            for stmt in tree.body if tree is not None else []:
                got = _target(stmt)
                if got is not None:
                    names.add(got[0])
    return names, files


def value_of(literal: str) -> float | int | None:
    tree = parse(literal)
    if tree is None or len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr):
        return None
    return arith(tree.body[0].value)
