"""Tests of the offline mutate proposer."""

from __future__ import annotations

import ast
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuswarm.research.mutate import Selection, candidates, digest, neighbours, propose
from gpuswarm.research.numeric import Constant, command_overrides, constants

TRAIN = '''"""A training script."""
import math

LEARNING_RATE = 0.04  # tuned by hand
WEIGHT_DECAY = 3e-4
DEPTH = 8
STEPS = 1_000
OFFSET = -2
WARMUP: int = 100  # annotated
EPS: float = 1e-8
lowercase = 5
NAME = "model"
USE_AMP = True
POW = 2**10
A, B = 1, 2
C = D = 3
EMPTY: int


def train() -> None:
    INNER = 3
    print(INNER)


class Config:
    FIELD = 4


if math.pi > 3:
    COND = 5
'''


def by_name(text: str) -> dict[str, Constant]:
    return {c.name: c for c in constants("train.py", text)}


def replace(text: str, c: Constant, new: str) -> str:
    return text[: c.start] + new + text[c.end :]


def test_constants_finds_top_level_numbers_only() -> None:
    found = by_name(TRAIN)
    assert list(found) == [
        "LEARNING_RATE",
        "WEIGHT_DECAY",
        "DEPTH",
        "STEPS",
        "OFFSET",
        "WARMUP",
        "EPS",
        "lowercase",  # any case: real scripts keep their knobs in lowercase variables
        "POW",
    ]
    assert (found["POW"].kind, found["POW"].literal, found["POW"].value) == ("power", "2**10", 1024)
    assert found["LEARNING_RATE"].value == 0.04
    assert found["WEIGHT_DECAY"].literal == "3e-4"
    assert found["STEPS"].literal == "1_000"
    assert found["STEPS"].value == 1000
    assert found["OFFSET"].literal == "-2"
    assert found["OFFSET"].value == -2
    assert found["WARMUP"].value == 100
    assert found["EPS"].line == 10
    for c in found.values():
        assert TRAIN[c.start : c.end] == c.literal
        assert c.path == "train.py"


def test_replacing_span_keeps_rest_of_line() -> None:
    c = by_name(TRAIN)["LEARNING_RATE"]
    new = replace(TRAIN, c, "0.05")
    assert "LEARNING_RATE = 0.05  # tuned by hand\n" in new
    assert new.replace("0.05", "0.04", 1) == TRAIN


def test_non_ascii_before_literal() -> None:
    text = '# é\nLABEL = "héllo→"; LR = 0.1  # 学习率\r\nX = 2\rY = 3\n'
    found = by_name(text)
    assert [text[c.start : c.end] for c in found.values()] == ["0.1", "2", "3"]
    new = replace(text, found["LR"], "0.2")
    assert new == text.replace("0.1", "0.2")
    assert by_name(new)["LR"].value == 0.2


def test_syntax_error_gives_nothing() -> None:
    bad = "LR = 0.1\ndef (:\n"
    assert constants("bad.py", bad) == []
    assert propose({"bad.py": bad}, random.Random(0), set()) is None
    assert propose({"x.py": "x = 'a'\nflag = True\n"}, random.Random(0), set()) is None


def test_float_neighbours_have_no_noise() -> None:
    lr = by_name(TRAIN)["LEARNING_RATE"]
    assert neighbours(lr) == ["0.02", "0.0268", "0.032", "0.036", "0.044", "0.05", "0.06", "0.08"]
    wd = neighbours(by_name(TRAIN)["WEIGHT_DECAY"])
    assert "3.3e-4" in wd and "6e-4" in wd
    assert all("e" in s and len(s) <= 7 for s in wd)
    for value in (0.1, 0.3, 0.7, 1.1, 123.456, 2.5e-5, 1e20):
        c = Constant("f.py", "X", repr(value), value, 1, 4, 4 + len(repr(value)))
        for s in neighbours(c):
            assert len(s.replace("-", "")) <= 12, s
            assert isinstance(ast.literal_eval(s), float)
            assert float(s) != value
    zero = Constant("f.py", "X", "0.0", 0.0, 1, 4, 7)
    assert [float(s) for s in neighbours(zero)] == [1e-4, 1e-3, 0.01, 0.1]


def test_int_neighbours_stay_positive_ints() -> None:
    def ints(v: int) -> list[int]:
        out = [ast.literal_eval(s) for s in neighbours(Constant("f", "X", str(v), v, 1, 0, 0))]
        assert all(type(n) is int for n in out)
        assert v not in out and len(set(out)) == len(out)
        return out

    for v in range(1, 300):
        assert all(n > 0 for n in ints(v)), v
    for v in range(-300, 0):
        assert all(n < 0 for n in ints(v)), v
    assert sorted(ints(1)) == [2, 3]
    assert sorted(ints(8)) == [4, 6, 12, 16]
    assert sorted(ints(64)) == [32, 48, 96, 128]
    assert sorted(ints(768)) == [384, 576, 960, 1152, 1536]
    assert sorted(ints(24)) == [12, 18, 30, 36, 48]  # scaled steps, no 24 -> 25
    assert ints(0) and all(n > 0 for n in ints(0))


def test_propose_is_deterministic() -> None:
    files = {"train.py": TRAIN, "other.py": "BATCH = 32\n"}

    def run(seed: int) -> list[str]:
        rng, tried, out = random.Random(seed), set[str](), []
        for _ in range(20):
            m = propose(files, rng, tried)
            assert m is not None
            tried.add(digest({**files, **m.files}))
            out.append(m.description)
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_propose_never_repeats_and_parses() -> None:
    files = {"train.py": TRAIN}
    rng, tried = random.Random(1), {digest(files)}
    for _ in range(50):
        m = propose(files, rng, tried)
        assert m is not None
        key = digest({**files, **m.files})
        assert key not in tried
        tried.add(key)
        ast.parse(m.files["train.py"])
        assert 1 <= len(m.changes) <= 2
        assert len({name for name, _, _ in m.changes}) == len(m.changes)
        for name, old, new in m.changes:
            assert f"{name} {old} -> {new}" in m.description
            assert by_name(m.files["train.py"])[name].literal == new


def test_propose_exhausts_single_constant() -> None:
    files = {"t.py": "LR = 0.04  # only one\n"}
    rng, tried = random.Random(3), set[str]()
    seen = set()
    for _ in range(20):
        m = propose(files, rng, tried)
        if m is None:
            break
        assert len(m.changes) == 1
        seen.add(m.changes[0][2])
        tried.add(digest({**files, **m.files}))
    assert m is None
    assert seen == set(neighbours(constants("t.py", files["t.py"])[0]))


def test_max_changes_one() -> None:
    files = {"train.py": TRAIN}
    rng = random.Random(5)
    for _ in range(100):
        m = propose(files, rng, set(), max_changes=1)
        assert m is not None and len(m.changes) == 1 and ", " not in m.description


def test_two_changes_happen_sometimes() -> None:
    rng = random.Random(2)
    counts = [len(m.changes) for _ in range(200) if (m := propose({"t.py": TRAIN}, rng, set()))]
    assert 20 < counts.count(2) < 120
    assert set(counts) == {1, 2}


@settings(max_examples=100, deadline=None)
@given(
    value=st.one_of(
        st.integers(min_value=-(10**12), max_value=10**12),
        st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False),
    ),
    seed=st.integers(min_value=0, max_value=2**32),
    prefix=st.text(alphabet="aé→ 学#", max_size=8),
)
def test_mutated_file_parses_and_only_literal_changes(value: float, seed: int, prefix: str) -> None:
    literal = repr(value)
    text = f"# {prefix}\nS = '{prefix}'; VALUE = {literal}  # {prefix}\nother = '1'\n"
    (c,) = constants("p.py", text)
    assert c.literal == literal and c.value == value
    m = propose({"p.py": text}, random.Random(seed), set())
    assert m is not None
    new = m.files["p.py"]
    ast.parse(new)
    ((name, old, lit),) = m.changes
    assert (name, old) == ("VALUE", literal)
    assert new == text[: c.start] + lit + text[c.end :]
    assert type(ast.literal_eval(lit)) is type(value)
    if isinstance(value, int) and value != 0:
        assert (int(lit) > 0) == (value > 0)


NANOGPT = """\
import math
from dataclasses import dataclass

out_dir = "out"
eval_interval = 2000
log_interval = 1
batch_size = 12
block_size = 1024
n_layer = 12
learning_rate = 6e-4
total_batch = 2**19
lr_scaled = 6e-4 / 2
betas = (0.9, 0.95)
dropout = 0.0
bias = False
flops_promised = 312e12
gradient_accumulation_steps = 5 * 8
gradient_accumulation_steps //= 2
warmup = 100
warmup = 200
exec(open("configurator.py").read())
tokens = batch_size * block_size * n_layer * learning_rate * total_batch * lr_scaled
tokens *= betas[0] * dropout * warmup * eval_interval * log_interval


@dataclass
class GPTConfig:
    n_embd: int = 768
    name: str = "gpt"


def report(mfu: float) -> None:
    print(f"mfu {mfu / flops_promised:.2%}")


parser = None
if parser:
    parser.add_argument("--wd", type=float, default=0.1)
"""


def test_constants_in_the_forms_real_scripts_use() -> None:
    found = by_name(NANOGPT)
    assert set(found) == {
        "eval_interval",
        "log_interval",
        "batch_size",
        "block_size",
        "n_layer",
        "learning_rate",
        "total_batch",
        "lr_scaled",
        "betas[0]",
        "betas[1]",
        "dropout",
        "flops_promised",
        "warmup",
        "GPTConfig.n_embd",
        "--wd",
    }  # not: strings, bools, a name assigned again by `//=`
    assert found["warmup"].literal == "200"  # the last assignment is the one that counts
    assert (found["total_batch"].kind, found["total_batch"].value) == ("power", 2**19)
    assert neighbours(found["total_batch"]) == ["2**18", "2**20"]
    assert (found["lr_scaled"].kind, found["lr_scaled"].value) == ("expr", 3e-4)
    assert found["betas[1]"].literal == "0.95"
    for c in found.values():
        assert NANOGPT[c.start : c.end] == c.literal
        for new in neighbours(c):
            ast.parse(NANOGPT[: c.start] + new + NANOGPT[c.end :])


def test_print_only_settings_are_skipped_and_selection_works() -> None:
    pool = {c.name for c, _ in candidates({"train.py": NANOGPT})}
    assert "flops_promised" not in pool  # only read inside print(): cannot change the metric
    assert {"n_layer", "betas[1]", "total_batch"} <= pool
    only = candidates({"train.py": NANOGPT}, Selection(include=("n_layer", "betas")))
    assert {c.name for c, _ in only} == {"n_layer", "betas[0]", "betas[1]"}
    named = candidates({"train.py": NANOGPT}, Selection(include=("flops_promised",)))
    assert [c.name for c, _ in named] == ["flops_promised"]  # named: the user knows better
    select = Selection(exclude=("*_interval", "betas"))
    rest = {c.name for c, _ in candidates({"train.py": NANOGPT}, select)}
    assert not rest & {"eval_interval", "log_interval", "betas[0]", "betas[1]"}
    assert select.skipped["eval_interval"] == "excluded"


def test_names_a_config_file_overrides_are_mutated_there_only() -> None:
    config = "n_layer = 4\nbatch_size = 8\n"
    tracked = {"train.py": NANOGPT, "config/tiny.py": config}
    names, files = command_overrides("python train.py config/tiny.py --learning_rate=1e-3", tracked)
    assert files == {"config/tiny.py"}
    assert names == {"n_layer", "batch_size", "learning_rate"}
    select = Selection(overridden=frozenset(names), config_files=frozenset(files))
    pool = candidates(tracked, select)
    where = {(c.path, c.name) for c, _ in pool}
    assert ("config/tiny.py", "n_layer") in where and ("config/tiny.py", "batch_size") in where
    assert not {n for p, n in where if p == "train.py"} & names
