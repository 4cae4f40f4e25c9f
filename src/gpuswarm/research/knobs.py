"""Which numeric settings of a training script are hyper-parameters worth a run.

``numeric.py`` finds every module-level number; many of them are not knobs, and proposing one
wastes a GPU run (or crashes it). Told apart here, by the script's own code (``ast``), never by
running it:

- **state**: a name stored again inside a loop (``iter_num += 1``, ``best_val_loss = ...``,
  ``running_mfu = ...``, a budget counter ``training_time += dt``), or by a function that
  declares it ``global``: its first value is where a counter starts, not a setting;
- **logging**: a name read only inside ``print``/logging calls (``print``, ``logger.info``,
  ``wandb.log`` ...), only as how often something that logs runs (``if it % log_interval ==
  0: print(...)``), or named
  as a logging or evaluation cadence (``log_interval``, ``eval_iters``, ``save_every`` ...);
- **time budget**: a name read only in comparisons with a time taken from the clock
  (``time.time()``, ``perf_counter()`` and what is computed from them), or named as a budget;
  the run's length is the harness's, not the variant's, to set.

:func:`bounds` gives the range a knob's value must stay in (betas, dropout and other
fractions in [0, 1)), :func:`heads_divide` that attention heads split the model's width; the
mutate proposer respects both.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping

_LOG_CALLS = frozenset({"print", "print0", "pprint", "log", "log_metrics", "write", "echo"})
_LOG_OWNERS = frozenset({"logging", "logger", "log", "wandb", "writer", "tb", "mlflow", "tqdm"})
_LOG_METHODS = frozenset(
    {
        "debug",
        "info",
        "warning",
        "error",
        "critical",
        "exception",
        "log",
        "add_scalar",
        "add_scalars",
        "log_metric",
        "log_metrics",
        "set_postfix",
        "set_description",
        "write",
    }
)
_CADENCE = re.compile(
    r"^(log|print|save|ckpt|checkpoint|eval|val|wandb|report|display)_?"
    r"(interval|every|freq|frequency|iters|steps|batches|period|n|count)$"
    r"|^(log|print|save|wandb|tensorboard)(_|$)",
    re.IGNORECASE,
)
_BUDGET = re.compile(r"budget|time_?limit|max_?(time|seconds|secs|minutes|duration)", re.I)
_CLOCKS = frozenset(
    {
        "time",
        "perf_counter",
        "monotonic",
        "process_time",
        "time_ns",
        "perf_counter_ns",
        "monotonic_ns",
        "now",
    }
)
_UNIT = re.compile(
    r"(^|[_.])(betas?\d*|dropout|drop|drop_?(rate|prob|path)|attn_?drop|resid_?drop|momentum"
    r"|ema(_decay)?|label_?smoothing|smoothing|prob|p_?drop|keep_?prob|frac|fraction|ratio"
    r"|warmup_?(ratio|frac))(\d*|\[\d+\])$",
    re.IGNORECASE,
)


def _stored_names(node: ast.AST) -> Iterator[str]:
    """The plain names ``node`` (a statement or expression) stores to."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            yield n.id


def _global_stores(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[tuple[str, int]]:
    """(name, line) a function stores to a module-level name it declares ``global``."""
    declared = {g for n in ast.walk(fn) if isinstance(n, ast.Global) for g in n.names}
    for sub in ast.walk(fn):
        if declared and isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            yield from ((name, sub.lineno) for name in _stored_names(sub) if name in declared)


_BLOCKS = (ast.If, ast.With, ast.AsyncWith, ast.Try, ast.Match)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _inner_blocks(stmt: ast.stmt) -> Iterator[tuple[list[ast.stmt], bool]]:
    """The statement lists inside ``stmt``, each with whether it runs as a loop's body."""
    loop = isinstance(stmt, _LOOPS)
    for name in ("body", "orelse", "finalbody"):
        inner = getattr(stmt, name, None)
        if inner:
            yield inner, loop and name == "body"
    for handler in getattr(stmt, "handlers", ()):
        yield handler.body, False
    for case in getattr(stmt, "cases", ()):
        yield case.body, False


def _loop_stores(tree: ast.Module) -> dict[str, int]:
    """Name -> a line where module-level code stores it inside a loop (or a function that
    declares it ``global`` does): the names that are run-time state."""
    found: dict[str, int] = {}
    todo: list[tuple[list[ast.stmt], bool]] = [(tree.body, False)]
    while todo:
        stmts, in_loop = todo.pop()
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for name, line in _global_stores(stmt):
                    found.setdefault(name, line)
                continue
            if isinstance(stmt, ast.ClassDef):
                continue
            if in_loop and not isinstance(stmt, (*_BLOCKS, *_LOOPS)):
                for name in _stored_names(stmt):
                    found.setdefault(name, stmt.lineno)
            if in_loop and isinstance(stmt, (ast.For, ast.AsyncFor)):
                for name in _stored_names(stmt.target):
                    found.setdefault(name, stmt.lineno)
            todo.extend((inner, in_loop or looped) for inner, looped in _inner_blocks(stmt))
    return found


def _is_log_call(node: ast.Call) -> bool:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id in _LOG_CALLS
    if isinstance(f, ast.Attribute):
        owner = f.value
        owner_name = (
            owner.id
            if isinstance(owner, ast.Name)
            else (owner.attr if isinstance(owner, ast.Attribute) else "")
        )
        if f.attr == "write":
            return owner_name in {"stdout", "stderr"}
        return f.attr in _LOG_METHODS and (
            owner_name.lower() in _LOG_OWNERS or "log" in owner_name.lower()
        )
    return False


def _clock_derived(tree: ast.Module) -> set[str]:
    """Names assigned from the clock (``t0 = time.time()``) or arithmetic on such names
    (``dt = t1 - t0``, ``training_time += dt``), to a fixpoint."""

    def clocky(expr: ast.AST, names: set[str]) -> bool:
        for n in ast.walk(expr):
            if isinstance(n, ast.Call):
                f = n.func
                attr = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if attr in _CLOCKS:
                    return True
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names:
                return True
        return False

    assigns = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None
    ]
    derived: set[str] = set()
    changed = True
    while changed:
        changed = False
        for a in assigns:
            assert a.value is not None
            if clocky(a.value, derived):
                for name in _stored_names(a):
                    if name not in derived:
                        derived.add(name)
                        changed = True
    return derived


def _contexts(tree: ast.Module) -> dict[int, str]:
    """id(node) -> ``log`` (inside a logging call), ``cadence`` (the right side of ``%`` in
    the test of an ``if`` that logs), ``clock`` (in a comparison with a clock-derived name)."""
    context: dict[int, str] = {}
    clock = _clock_derived(tree)

    def mark(node: ast.AST, kind: str) -> None:
        for n in ast.walk(node):
            context.setdefault(id(n), kind)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_log_call(node):
            mark(node, "log")
        elif isinstance(node, ast.If) and any(
            isinstance(n, ast.Call) and _is_log_call(n) for b in node.body for n in ast.walk(b)
        ):  # `if step % log_interval == 0: print(...)`: how often, not what
            for mod in ast.walk(node.test):
                if isinstance(mod, ast.BinOp) and isinstance(mod.op, ast.Mod):
                    mark(mod.right, "cadence")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Name) and s.id in clock for s in sides):
                for side in sides:
                    mark(side, "clock")
    return context


def _uses(tree: ast.Module) -> dict[str, set[str]]:
    """Name -> how its reads are used (``_contexts``' kinds, ``other`` for the rest)."""
    context = _contexts(tree)
    uses: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            uses.setdefault(node.id, set()).add(context.get(id(node), "other"))
    return uses


def not_knobs(tree: ast.Module) -> dict[str, str]:
    """Module-level names of a parsed script that are no hyper-parameter -> why, in the words
    ``research mutate --list`` shows."""
    why: dict[str, str] = {}
    for name, line in _loop_stores(tree).items():
        why[name] = f"state: assigned again in a loop (line {line})"
    for name, kinds in _uses(tree).items():
        if name in why:
            continue
        if kinds == {"log"}:
            why[name] = "used only in logging/printing"
        elif kinds <= {"log", "cadence"} and "cadence" in kinds:
            why[name] = "how often something is logged or evaluated (x % name), not training"
        elif kinds <= {"log", "clock"} and "clock" in kinds:
            why[name] = "the time budget (compared with the clock): the harness's to set"
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else ([node.target] if isinstance(node, ast.AnnAssign) else [])
        )
        for t in targets:
            if isinstance(t, ast.Name) and t.id not in why:
                if _BUDGET.search(t.id):
                    why[t.id] = "the time budget (by its name): the harness's to set"
                elif _CADENCE.search(t.id):
                    why[t.id] = "a logging/evaluation setting (by its name), not training"
    return why


def bounds(name: str) -> tuple[float, float] | None:
    """The half-open range [low, high) a knob's value must stay in, by its name (betas,
    dropout, momentum, EMA decay and other fractions: [0, 1)); None: any value of its sign."""
    base = name.lstrip("-")
    return (0.0, 1.0) if _UNIT.search(base) else None


_HEADS = re.compile(r"^(n_?heads?|num_(attention_)?heads|heads)$", re.IGNORECASE)
_WIDTHS = re.compile(
    r"^(n_?embd|n_?embed|d_?model|hidden_?(size|dim)|embed_?dim|emb_?dim|model_?dim|dim|width)$",
    re.IGNORECASE,
)


def heads_divide(values: Mapping[str, object]) -> bool:
    """Whether every attention head count among ``values`` (setting name -> value) divides
    every model width there (nanoGPT asserts ``n_embd % n_head == 0`` when it builds the
    model: a variant with 9 heads of a 768 width crashes)."""

    def ints(pattern: re.Pattern[str]) -> list[int]:
        return [
            v
            for name, v in values.items()
            if pattern.match(name.rsplit(".", 1)[-1].split("[")[0].lstrip("-"))
            and isinstance(v, int)
            and not isinstance(v, bool)
            and v > 0
        ]

    return all(w % h == 0 for h in ints(_HEADS) for w in ints(_WIDTHS))
