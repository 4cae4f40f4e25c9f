"""The rules docs/architecture.md states, checked on the code by its syntax tree (``ast``), not by
grepping strings a rename can dodge (the layers are import-linter's contracts, `lint-imports`).

Where a rule is not kept yet by modules other work of this round is changing, the exception is
an explicit allow-list here that may only shrink: a module that grows past its recorded size, or
a breach that is not listed, fails; a listed one that is fixed may (and should) leave the list.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "gpuswarm"
MAX_LINES = 400

# -- the modules and their imports --------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str  # gpuswarm.store.queue
    path: Path
    tree: ast.Module
    lines: int

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@functools.cache
def modules() -> dict[str, Module]:
    out: dict[str, Module] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "demo_assets" in path.parts:  # the demo's train.py/prepare.py: user scripts
            continue
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text(encoding="utf-8")
        name = ".".join(parts)
        out[name] = Module(name, path, ast.parse(text, str(path)), len(text.splitlines()))
    return out


def _absolute(mod: Module, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, relative imports made absolute."""
    if node.level == 0:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _ours(name: str) -> str | None:
    """The longest module of ours that ``name`` (a module, or a name inside one) lies in."""
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


@dataclass(frozen=True)
class Imported:
    target: str  # the absolute dotted name imported (a module, or module.name)
    names: tuple[str, ...]  # what a ``from`` import takes from it ((): a plain import)
    line: int


@functools.cache
def _nodes(name: str) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(modules()[name].tree))


def nodes(mod: Module) -> tuple[ast.AST, ...]:
    """Every node of the module's tree (walked once; a module not on disk, each time)."""
    if modules().get(mod.name) is not mod:
        return tuple(ast.walk(mod.tree))
    return _nodes(mod.name)


def imports(mod: Module) -> Iterator[Imported]:
    """Every import of the module, wherever it stands: the top, a function, ``TYPE_CHECKING``."""
    for node in nodes(mod):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Imported(alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(a.name for a in node.names)
            yield Imported(_absolute(mod, node), names, node.lineno)


def _top(name: str) -> str:
    return name.partition(".")[0]


def importers_of(*tops: str) -> dict[str, int]:
    """Modules that import any of the top-level packages ``tops`` (by ``import``, ``from`` or
    ``importlib.import_module("...")`` with a literal name): module -> first line."""
    out: dict[str, int] = {}
    for mod in modules().values():
        for imp in imports(mod):
            if _top(imp.target) in tops:
                out.setdefault(mod.name, imp.line)
        for node in nodes(mod):
            if (
                isinstance(node, ast.Call)
                and _called(node) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and _top(str(node.args[0].value)) in tops
            ):
                out.setdefault(mod.name, node.lineno)
    return out


def _called(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


@functools.cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of ours it imports (a ``from pkg import mod`` imports ``pkg.mod``)."""
    known = modules()
    out: dict[str, frozenset[str]] = {}
    for mod in known.values():
        edges: set[str] = set()
        for imp in imports(mod):
            if _top(imp.target) != "gpuswarm":
                continue
            targets = [f"{imp.target}.{n}" for n in imp.names] or [imp.target]
            for target in targets:
                found = target if target in known else _ours(target)
                if found is not None and found != mod.name:
                    edges.add(found)
        out[mod.name] = frozenset(edges)
    return out


def strongly_connected(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, frozenset())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out


def _short(name: str) -> str:
    return name.removeprefix("gpuswarm.")


# -- the top level ------------------------------------------------------------------------------

MAX_TOP_LEVEL = 4  # issue 32: the command groups are cli/, the rest of a run app/


def test_at_most_4_modules_at_the_top_level() -> None:
    """src/gpuswarm holds packages and at most 4 modules (``__init__``, ``__main__``, ``api``:
    the facade's public name)."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, (
        f"{len(top)} modules at the top level ({', '.join(top)}): put them in a package"
    )


# -- no import loop ------------------------------------------------------------------------------


def test_the_check_finds_an_import_loop() -> None:
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}
    assert sorted(strongly_connected(edges)) == [["a", "b", "c"], ["d"]]


def test_no_import_loop() -> None:
    """Imports form no loop, counting those in functions and under ``TYPE_CHECKING``: each
    strongly connected component of the module graph is one module."""
    loops = [c for c in strongly_connected(graph()) if len(c) > 1]
    assert not loops, "import loops: " + "; ".join(" <-> ".join(map(_short, c)) for c in loops)


def test_the_graph_sees_function_level_imports() -> None:
    # api.cancel imports control_ops inside the function (loaded only by the one caller)
    assert "gpuswarm.app.control" in graph()["gpuswarm.app.api"]


# -- no module over 400 lines --------------------------------------------------------------------


def test_no_module_over_400_lines() -> None:
    found = {m.name: m.lines for m in modules().values()}
    bad = [f"{_short(name)}: {n} lines" for name, n in sorted(found.items()) if n > MAX_LINES]
    assert not bad, "split these modules: " + "; ".join(bad)


MAX_CLASS_LINES = 300


def big_classes(mod: Module) -> list[str]:
    """``Name: lines`` of each class of ``mod`` longer than :data:`MAX_CLASS_LINES` (from its
    ``class`` line to its last line, nested classes counted in their own right too)."""
    return [
        f"{node.name}: {size} lines"
        for node in nodes(mod)
        if isinstance(node, ast.ClassDef)
        and (size := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
    ]


def test_no_class_over_300_lines() -> None:
    bad = [f"{_short(m.name)}.{c}" for m in modules().values() for c in big_classes(m)]
    assert not bad, "split these classes (a mixin or a collaborator): " + "; ".join(bad)


def test_the_check_sees_a_big_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    text = f"class Big:\n{body}\n\n\nclass Small:\n    y = 1\n"
    mod = Module("gpuswarm.big", Path("big.py"), ast.parse(text), len(text.splitlines()))
    assert big_classes(mod) == [f"Big: {MAX_CLASS_LINES + 1} lines"]


# -- no import of another module's private names -------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(mod: Module) -> set[tuple[str, str]]:
    """(module, owner.name) for each private name of another module of ours it imports, or
    reads off a module of ours it imported (``tree._REG``)."""
    known = modules()
    out: set[tuple[str, str]] = set()
    aliases: dict[str, str] = {}  # local name -> a module of ours
    for node in nodes(mod):
        if isinstance(node, ast.ImportFrom):
            base = _absolute(mod, node)
            if _top(base) != "gpuswarm":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    aliases[alias.asname or alias.name] = full
                elif _private(alias.name) and _ours(base) != mod.name:
                    out.add((mod.name, full))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in known:
                    aliases[alias.asname] = alias.name
    for node in nodes(mod):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and aliases.get(node.value.id, mod.name) != mod.name
        ):
            out.add((mod.name, f"{aliases[node.value.id]}.{node.attr}"))
    return out


def test_the_check_finds_private_imports() -> None:
    source = (
        "from gpuswarm.exec.local.tree import _leader_children\n"
        "from gpuswarm.exec.local import tree\n"
        "tree._reap(1)\n"
    )
    probe = PACKAGE / "exec" / "local" / "probe.py"
    mod = Module("gpuswarm.exec.local.probe", probe, ast.parse(source), 3)
    assert private_uses(mod) == {
        ("gpuswarm.exec.local.probe", "gpuswarm.exec.local.tree._leader_children"),
        ("gpuswarm.exec.local.probe", "gpuswarm.exec.local.tree._reap"),
    }


def test_no_import_of_another_modules_private_names() -> None:
    found = set().union(*(private_uses(m) for m in modules().values()))
    bad = sorted(f"{_short(m)} uses {_short(n)}" for m, n in found)
    assert not bad, "private names of another module (make them public, or move): " + "; ".join(bad)


# -- the device doors and the process doors ------------------------------------------------------


def test_only_the_nvml_door_imports_the_gpu_libraries() -> None:
    """pynvml and amdsmi: only placement/nvml.py (discovery, the sampler, the live table and
    the dashboard ask through it)."""
    assert set(importers_of("pynvml", "amdsmi")) == {"gpuswarm.placement.nvml"}


def test_the_check_sees_import_module_by_name() -> None:
    # placement/nvml.py loads pynvml by importlib.import_module("pynvml")
    assert "gpuswarm.placement.nvml" in importers_of("pynvml")


def test_a_run_loads_no_rich() -> None:
    """`gpuswarm run` (and the supervisor, its notifier's journal follower) loads rich only to
    print a view (issue 31: start-up time); a fresh interpreter imports the run's modules."""
    code = (
        "import sys, gpuswarm.cli.supervise, gpuswarm.app.engine, gpuswarm.notify.notifier\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.timeout(120)
def test_a_plain_run_to_its_report_loads_no_view_and_no_http(tmp_path: Path) -> None:
    """The whole of a real `gpuswarm run` (one passing and one failing task, the end-of-run
    report printed) loads neither rich (the report is plain lines: ui/endreport.py) nor the
    HTTP stack (a run without a notify block never loads notify/deliver.py): issue 31's
    start-up and end. The modules come from the interpreter's own import log."""
    (tmp_path / "cmds.txt").write_text("true\nfalse\n")
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpuswarm", "run", "-q", "--gpus", "sim:2",
         "--workspace", str(tmp_path / "ws"), str(tmp_path / "cmds.txt")],
        capture_output=True, text=True, timeout=100, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]  # one task failed
    assert "finished with failures: 1 failed" in out.stderr
    loaded = {
        line.rsplit("|", 1)[1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "gpuswarm.ui.endreport" in loaded and "gpuswarm.app.engine" in loaded
    unwanted = {"urllib.request", "http.client", "ssl", "gpuswarm.notify.deliver"}
    assert not {m for m in loaded if m.split(".")[0] == "rich" or m in unwanted}


def test_only_the_ray_backend_imports_ray() -> None:
    found = importers_of("ray")
    assert found and all(name.startswith("gpuswarm.exec.ray.") for name in found), found


# who runs or inspects processes, and why (the backends run the tasks; the others run no task)
PROCESS_MODULES = {
    # the backends: a task's processes
    "gpuswarm.exec.local.process": "one attempt: psutil on its tree",
    "gpuswarm.exec.local.programs": "an attempt's Popen (its program from a kept PATH search)",
    "gpuswarm.exec.local.tree": "the subreaper's table: kill trees, the sweep",
    "gpuswarm.exec.local.keeper": "the log keeper, a helper process",
    "gpuswarm.exec.local.spawn": "an attempt's spawn and its end classified",
    "gpuswarm.exec.local.waiter": "an attempt's blocking waits",
    "gpuswarm.exec.local.backend": "end_leftovers by environment",
    "gpuswarm.exec.local.host_processes": "processes that are no task (research runners)",
    "gpuswarm.exec.docker.client": "bounded docker CLI calls",
    "gpuswarm.exec.docker.container": "one attempt's container",
    "gpuswarm.exec.docker.backend": "the docker backend",
    "gpuswarm.exec.ray.actor": "on the node: each attempt a local Attempt",
    "gpuswarm.exec.ray.guard": "on the node: the actor's guard process",
    # no task: a lock holder's liveness, this supervisor's identity
    "gpuswarm.core.fsutil": "a temp file's writer alive",
    "gpuswarm.store.leases": "an owner's pid alive (and not reused)",
    # no task: `command -v` in /bin/sh (the preflight commands run through the backend)
    "gpuswarm.supervise.preflight": "does a task's program exist",
    # no task: GPU tools
    "gpuswarm.placement.probes": "nvidia-smi, amd-smi, rocm-smi",
    "gpuswarm.placement.gpus": "runs the probes' tools",
    # no task: git, the proposer agent, the background runner
    "gpuswarm.research.gitops": "git",
    "gpuswarm.research.agent": "the proposer agent's CLI",
    "gpuswarm.research.runner": "the detached runner",
    "gpuswarm.research.loop_commands": "the loop's runner",
    "gpuswarm.research.experiment": "/bin/sh -n parses a shell --command",
    "gpuswarm.cli.demo": "git for the demo's scratch repo",
    # no task: Slurm's own commands (the attempts run under each node's `gpuswarm work`)
    "gpuswarm.exec.slurm.allocation": "scontrol, squeue: the job's nodes and time left",
    "gpuswarm.exec.slurm.workers": "srun: the shared-folder probe, a worker per node",
    "gpuswarm.exec.slurm.jobs": "sbatch, squeue, sacct, scancel: the worker jobs",
}


def test_who_imports_subprocess_and_psutil() -> None:
    """Only the backends run or inspect a task's processes; the other modules listed run none
    (a tool, git, a lock holder's liveness): the list is the rule."""
    found = importers_of("subprocess", "psutil")
    extra = sorted(set(found) - set(PROCESS_MODULES))
    assert not extra, "imports subprocess/psutil without being listed: " + ", ".join(extra)


# -- one owner per file format -------------------------------------------------------------------


def _calls(mod: Module) -> Iterator[ast.Call]:
    for node in nodes(mod):
        if isinstance(node, ast.Call):
            yield node


def renames(mod: Module) -> list[int]:
    """Lines that rename a file: os.rename/os.replace/os.renames, shutil.move, and
    ``Path.rename``/``Path.replace`` (one argument: str.replace takes two)."""
    out = []
    for call in _calls(mod):
        name = _dotted(call.func) if isinstance(call.func, ast.Attribute) else ""
        if name in ("os.rename", "os.replace", "os.renames", "shutil.move") or (
            isinstance(call.func, ast.Attribute)
            and call.func.attr in ("rename", "replace")
            and len(call.args) == 1
            and not call.keywords
            and not isinstance(call.args[0], ast.Constant)
        ):
            out.append(call.lineno)
    return out


# who renames files, and what: only store/queue.py and its mixins rename a descriptor between (or
# inside) the queue's state folders; the others rename files of their own
RENAMERS = {
    "gpuswarm.store.queue": "a claim, a reclaim (take_lease), a descriptor set aside",
    "gpuswarm.store.moves": "a claimed descriptor moved on (DirQueue's mixin)",
    "gpuswarm.store.holds": "pending tasks held: withdraw, cancel, priority (DirQueue's mixin)",
    "gpuswarm.store.retries": "failed and cancelled tasks retried (DirQueue's mixin)",
    "gpuswarm.core.fsutil": "temp + fsync + rename of any file written",
    "gpuswarm.store.runs": "a staged run renamed into place",
    "gpuswarm.store.cleanup": "a run renamed aside before it is removed",
    "gpuswarm.exec.plan": "a stale completion file moved aside in the task workspace",
    "gpuswarm.exec.sandbox": "a provisioned copy put in place in a slot's HOME",
    "gpuswarm.exec.ray.wire": "an attempt's outputs written home",
    "gpuswarm.supervise.after_all": "the after_all log put in place",
    "gpuswarm.research.exports": "a variant's export put in place",
    "gpuswarm.research.variants": "a proposer's file put in place",
    "gpuswarm.research.plot": "progress.png",
    "gpuswarm.research.configure": "an experiment made by one rename",
    "gpuswarm.store.batches": "the queue's add batches and requeues (DirQueue's mixin)",
    "gpuswarm.store.spool": "a streamed enqueue's descriptors moved from its spool into pending/",
    # issue 35: tasks waiting for prerequisites, in and out of blocked/ (each take -> save ->
    # journal -> rename, BlockedFolder), beside the queue's own transitions
    "gpuswarm.store.blocked": "the moves of blocked tasks (settle, block again, finish cut)",
}


def test_who_renames_files() -> None:
    found = {m.name: renames(m) for m in modules().values()}
    extra = sorted(
        f"{_short(n)}:{lines[0]}" for n, lines in found.items() if lines and n not in RENAMERS
    )
    assert not extra, "renames files without being listed (queue moves go through DirQueue): " + (
        ", ".join(extra)
    )


def test_the_check_sees_a_rename() -> None:
    assert renames(modules()["gpuswarm.store.queue"])
    assert not renames(modules()["gpuswarm.core.words"])


def raw_kind_reads(mod: Module) -> list[int]:
    """Lines that read a journal line's raw kind (``e["ev"]``, ``e.get("ev")``, ``"ev" in e``)."""
    out = []
    for node in nodes(mod):
        if (
            (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant)
                and node.slice.value == "ev"
            )
            or (
                isinstance(node, ast.Call)
                and _called(node) == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "ev"
            )
            or (
                isinstance(node, ast.Compare)
                and isinstance(node.left, ast.Constant)
                and node.left.value == "ev"
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            )
        ):
            out.append(node.lineno)
    return out


RAW_EVENT_READERS = {
    "gpuswarm.core.events": "the run journal's owner: decode",
    "gpuswarm.core.records": "the checks of journal lines read back",
    "gpuswarm.research.journal": "research's own ledger (ledger.jsonl): its owner",
    "gpuswarm.research.entries": "research's ledger lines: their types and their parse",
    "gpuswarm.research.replay": "research's ledger replayed under another policy",
}


def test_who_reads_raw_event_keys() -> None:
    """The run journal's lines are read through core/events (``decode``, RunView); only the
    modules listed look at a raw line's kind."""
    found = {m.name: raw_kind_reads(m) for m in modules().values()}
    extra = sorted(
        f"{_short(n)}:{lines[0]}"
        for n, lines in found.items()
        if lines and n not in RAW_EVENT_READERS
    )
    assert not extra, "reads raw event keys (decode them through core.events): " + ", ".join(extra)


def test_the_checks_see_raw_reads_and_process_imports() -> None:
    known = modules()
    assert raw_kind_reads(known["gpuswarm.core.events"])  # kind_of: data.get("ev")
    assert raw_reads_in(ast.walk(ast.parse('task = desc.raw.get("id")')))
    assert "gpuswarm.exec.local.programs" in importers_of("subprocess")


def raw_descriptor_reads(mod: Module) -> list[int]:
    """Lines that read a descriptor's raw JSON object (``desc.raw[...]``, ``desc.raw.get``)."""
    return raw_reads_in(nodes(mod))


def raw_reads_in(found: Iterable[ast.AST]) -> list[int]:
    """The lines of ``found`` (a tree's nodes) that read ``x.raw[...]`` or ``x.raw.get(...)``."""
    out = []
    for node in found:
        target: ast.expr | None = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value if node.func.attr == "get" else None
        if isinstance(target, ast.Attribute) and target.attr == "raw":
            out.append(target.lineno)
    return out


def test_who_reads_raw_descriptor_keys() -> None:
    """Descriptors and attempt records are read through core/models' typed views."""
    bad = []
    for mod in modules().values():
        if mod.name.startswith("gpuswarm.core.models"):
            continue
        lines = raw_descriptor_reads(mod)
        if lines:
            bad.append(f"{_short(mod.name)}:{lines[0]}")
    assert not bad, "reads a descriptor's raw keys (add a typed property): " + ", ".join(bad)


# -- who joins run paths -------------------------------------------------------------------------

# names only a run folder has: joined by core/paths.RunPaths alone
RUN_NAMES = frozenset(
    {".parallel", "run.json", "events.jsonl", "output.log", "after_all.log", "ray.log"}
)


def run_path_joins(mod: Module) -> list[int]:
    """Lines that join a run folder's name (``x / ".parallel"``, ``joinpath``, ``Path(a, b)``,
    ``os.path.join``) or join under ``RunPaths.parallel`` (``paths.parallel / "x"``)."""
    out = []
    for node in nodes(mod):
        parts: list[ast.expr] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts = [node.left, node.right]
            if isinstance(node.left, ast.Attribute) and node.left.attr == "parallel":
                out.append(node.lineno)
                continue
        elif isinstance(node, ast.Call) and (
            _called(node) in ("joinpath", "Path") or _dotted(node.func) == "os.path.join"
        ):
            parts = list(node.args)
        out.extend(p.lineno for p in parts if isinstance(p, ast.Constant) and p.value in RUN_NAMES)
    return out


def test_who_joins_run_paths() -> None:
    """No module but core/paths.RunPaths joins a run folder's paths."""
    bad = []
    for mod in modules().values():
        if mod.name == "gpuswarm.core.paths":
            continue
        lines = run_path_joins(mod)
        if lines:
            bad.append(f"{_short(mod.name)}:{lines[0]}")
    assert not bad, "joins run paths (ask core.paths.RunPaths): " + ", ".join(bad)


def test_the_check_sees_a_run_path_join() -> None:
    assert run_path_joins(modules()["gpuswarm.core.paths"])


# -- the map -------------------------------------------------------------------------------------


def test_every_module_is_on_the_map() -> None:
    """docs/architecture.md names every module (its file name, in the package's listing)."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = sorted(
        str(m.path.relative_to(PACKAGE))
        for m in modules().values()
        if m.path.name not in ("__init__.py", "__main__.py") and m.path.name not in doc
    )
    assert not missing, "modules docs/architecture.md does not name: " + ", ".join(missing)


# -- one place builds a run's setup --------------------------------------------------------------


def test_one_place_builds_a_runs_setup() -> None:
    """A run's ``Setup`` is built by app/prepare.py alone (``prepare()``, by keyword: run,
    resume, work and the api's serve call it); the others take it from there."""
    found = sorted(
        m.name for m in modules().values() if any(_called(c) == "Setup" for c in _calls(m))
    )
    assert found == ["gpuswarm.app.prepare"], found
