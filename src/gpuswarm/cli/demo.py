"""``gpuswarm demo``: the whole product in a minute or two, with no GPU and no LLM.

It makes a scratch git repository (outside the user's tree) with a tiny numpy character-level
language model (``train.py``, trained for a fixed wall-clock budget, printing autoresearch's
summary block) and its read-only data and evaluation (``prepare.py``), then runs
``research loop --proposer mutate`` on simulated GPUs with the live view, and ends with the
best result and the paths of results.tsv, progress.png and report.html.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import configure, runner, session
from gpuswarm.research.loop import LoopOptions, run_loop
from gpuswarm.research.proposers import MutateProposer

ASSETS = ("train.py", "prepare.py", "corpus.txt", "README.md")
BUDGET_VAR = "GPUSWARM_DEMO_BUDGET"


@dataclass(frozen=True)
class DemoOptions:
    where: Path | None = None  # default: a new folder in the system's temp dir
    experiments: int = 20
    budget: float = 4.0  # seconds of training per experiment
    gpus: str = "sim:4"
    seed: int | None = None
    live: bool = True


def make_repo(where: Path | None) -> Path:
    """A fresh git repository holding the demo's files, committed."""
    root = Path(tempfile.mkdtemp(prefix="gpuswarm-demo-")) if where is None else where
    repo = root / "autoresearch-demo"
    if repo.exists():
        raise ResearchError(f"{repo} already exists; pass another --dir (or remove it)")
    repo.mkdir(parents=True)
    assets = resources.files("gpuswarm") / "demo_assets"
    for name in ASSETS:
        (repo / name).write_bytes((assets / name).read_bytes())
    (repo / ".gitignore").write_text("__pycache__/\n")
    for argv in (
        ["init", "-q", "-b", "master"],
        ["config", "user.name", "gpuswarm demo"],
        ["config", "user.email", "demo@gpuswarm.invalid"],
        ["add", "."],
        ["commit", "-q", "-m", "demo: a tiny numpy language model"],
    ):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True)
    return repo


def run_demo(opts: DemoOptions, say: Any = print) -> dict[str, Any]:
    if shutil.which("git") is None:
        raise ResearchError("the demo needs git on PATH (it makes a scratch repository)")
    repo = make_repo(opts.where)
    say(f"demo repository: {repo}")
    os.environ[BUDGET_VAR] = f"{opts.budget:g}"  # the runner and its runs inherit it
    init = configure.InitOptions(
        tag="demo",
        edit=["train.py"],
        protect=["prepare.py"],
        command=f"{shlex.quote(sys.executable)} train.py",
        metric="val_bpb",
        goal="min",
        timeout=max(60.0, opts.budget * 10),
        gpus=opts.gpus,
        linger=5.0,
    )
    configure.init(repo, init)
    exp = session.Experiment.open(repo, "demo")
    loop_opts = LoopOptions(mode="async", max_experiments=opts.experiments)
    proposer = MutateProposer(exp.paths, exp.cfg, opts.seed)
    try:
        if opts.live:
            from gpuswarm.research.views import run_loop_live

            data = run_loop_live(exp, proposer, loop_opts)
        else:
            data = run_loop(exp, proposer, loop_opts, say)
    finally:
        runner.stop_runner(exp.paths, grace=10.0)
    return {**data, "repo": str(repo)}  # baseline, best, kept: research/figures.py
