"""Tests of the `gpuswarm demo` assets: train.py runs and reports, prepare.py scores correctly."""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import gpuswarm
from gpuswarm.research import mutate, numeric

ASSETS = Path(gpuswarm.__file__).resolve().parent / "demo_assets"
FILES = ("train.py", "prepare.py", "corpus.txt")
SUMMARY_KEYS = (
    "val_bpb",
    "training_seconds",
    "total_seconds",
    "peak_vram_mb",
    "num_steps",
    "num_params_M",
)
HYPERPARAMETERS = {
    "LEARNING_RATE",
    "BATCH_SIZE",
    "CONTEXT",
    "EMBED_DIM",
    "HIDDEN_DIM",
    "INIT_SCALE",
    "WEIGHT_DECAY",
    "WARMUP_FRAC",
    "FINAL_LR_FRAC",
}
LINE = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) = (?P<literal>-?[0-9][0-9_.eE+-]*)  # \S.*$")


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    for name in FILES:
        shutil.copy(ASSETS / name, tmp_path / name)
    return tmp_path


@pytest.fixture(scope="module")
def prepare() -> Iterator[ModuleType]:
    name = "gpuswarm_demo_prepare"
    spec = importlib.util.spec_from_file_location(name, ASSETS / "prepare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks its module up while being defined
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.dont_write_bytecode = dont_write
        del sys.modules[name]


def run_train(folder: Path, budget: float = 0.5) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUSWARM_DEMO_BUDGET": str(budget)}
    cmd = [sys.executable, "train.py"]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=60)


def summary(stdout: str) -> dict[str, float]:
    """The summary block after the last '---' line, as floats."""
    lines = stdout.splitlines()
    assert "---" in lines, stdout
    block = lines[len(lines) - 1 - lines[::-1].index("---") + 1 :]
    pairs = [re.fullmatch(r"(\w+):\s+(\S+)", line) for line in block]
    assert all(pairs), block
    return {m.group(1): float(m.group(2)) for m in pairs if m}


def set_constant(path: Path, name: str, factor: float) -> None:
    text = path.read_text()
    (c,) = [c for c in numeric.constants(path.name, text) if c.name == name]
    path.write_text(text[: c.start] + repr(c.value * factor) + text[c.end :])


def test_train_runs_and_prints_the_summary(demo: Path, prepare: ModuleType) -> None:
    proc = run_train(demo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(proc.stdout)
    assert tuple(result) == SUMMARY_KEYS
    assert math.isfinite(result["val_bpb"])
    assert 0 < result["val_bpb"] < math.log2(prepare.load().vocab_size) - 1
    assert result["num_steps"] > 0
    assert result["num_params_M"] > 0
    assert not (demo / "__pycache__").exists()


def test_a_higher_learning_rate_variant_completes(demo: Path) -> None:
    set_constant(demo / "train.py", "LEARNING_RATE", 3)
    proc = run_train(demo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = summary(proc.stdout)
    assert math.isfinite(result["val_bpb"])
    assert result["num_steps"] > 0


def test_a_context_longer_than_the_harness_gives_crashes(demo: Path, prepare: ModuleType) -> None:
    path = demo / "train.py"
    text = path.read_text()
    (c,) = [c for c in numeric.constants("train.py", text) if c.name == "CONTEXT"]
    path.write_text(text[: c.start] + str(prepare.SEQ_LEN + 1) + text[c.end :])
    proc = run_train(demo, budget=0.1)
    assert proc.returncode != 0
    assert "val_bpb:" not in proc.stdout


def test_uniform_predictor_scores_log2_vocab(prepare: ModuleType) -> None:
    vocab_size = prepare.load().vocab_size
    bpb = prepare.evaluate_bpb(lambda x: np.zeros((len(x), vocab_size)))
    assert abs(bpb - math.log2(vocab_size)) < 1e-6


def test_evaluation_is_fixed_and_bounded(prepare: ModuleType) -> None:
    data = prepare.load()
    assert not set(data.train_pos.tolist()) & set(data.val_pos.tolist())
    positions = prepare.eval_positions()
    assert 4000 <= len(positions) <= 8000
    assert set(positions.tolist()) <= set(data.val_pos.tolist())
    rng = np.random.default_rng(0)
    table = rng.standard_normal((data.vocab_size, data.vocab_size))

    def predict(x: np.ndarray) -> np.ndarray:
        assert x.shape[1] == prepare.SEQ_LEN
        out: np.ndarray = table[x[:, -1]] * 1000  # a bigram guess with huge logits: still finite
        return out

    first = prepare.evaluate_bpb(predict)
    assert math.isfinite(first)
    assert prepare.evaluate_bpb(predict) == first
    x, y = prepare.get_batch("train", 32, rng, 5)
    assert x.shape == (32, 5) and y.shape == (32,)
    with pytest.raises(ValueError):
        prepare.get_batch("train", 4, rng, prepare.SEQ_LEN + 1)


def test_train_constants_are_plain_mutable_lines(prepare: ModuleType) -> None:
    text = (ASSETS / "train.py").read_text()
    lines = text.splitlines()
    found = {}
    for stmt in ast.parse(text).body:
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not any(re.fullmatch(r"[A-Z][A-Z0-9_]*", n) for n in names):
            continue
        assert isinstance(stmt, ast.Assign) and len(names) == 1, lines[stmt.lineno - 1]
        assert isinstance(stmt.value, ast.Constant), lines[stmt.lineno - 1]
        value = stmt.value.value
        assert isinstance(value, (int, float)) and not isinstance(value, bool)
        match = LINE.match(lines[stmt.lineno - 1])
        assert match and match.group("name") == names[0], lines[stmt.lineno - 1]
        found[names[0]] = value
    assert set(found) == HYPERPARAMETERS
    assert 1 <= found["CONTEXT"] <= prepare.SEQ_LEN
    constants = numeric.constants("train.py", text)
    assert {c.name for c in constants} == HYPERPARAMETERS
    assert all(mutate.neighbours(c) for c in constants)


def test_corpus_is_plain_ascii_prose() -> None:
    data = (ASSETS / "corpus.txt").read_bytes()
    assert 20_000 <= len(data) <= 60_000
    assert all(b == 10 or 32 <= b < 127 for b in data)
