"""Issue 29, item 6: mutate proposes hyper-parameters, not state.

On a script in nanoGPT's shape (tests/data/research/nanogpt_train.py: the configurator pattern,
loop state in module-level names, logging cadence, a time budget) none of the names that
wasted 7 of 18 proposals on the real nanoGPT is proposed, and no proposal leaves a known range.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from gpuswarm.research import knobs
from gpuswarm.research.mutate import Selection, candidates, neighbours, propose
from gpuswarm.research.numeric import Constant, command_overrides, constants

NANOGPT = (Path(__file__).parents[1] / "data" / "research" / "nanogpt_train.py").read_text()

NOT_KNOBS = {
    "log_interval": "logged or evaluated",
    "eval_interval": "logged or evaluated",
    "eval_iters": "logging/evaluation setting",
    "iter_num": "state",
    "running_mfu": "state",
    "best_val_loss": "state",
    "training_time": "state",
    "local_iter_num": "state",
    "time_budget": "time budget",
}
KNOBS = {"learning_rate", "n_layer", "n_embd", "batch_size", "dropout", "beta1", "beta2"}


def pool(text: str, select: Selection | None = None) -> dict[str, list[str]]:
    return {c.name: options for c, options in candidates({"train.py": text}, select)}


def test_state_logging_and_budget_names_are_no_knobs() -> None:
    select = Selection()
    found = pool(NANOGPT, select)
    assert set(found) >= KNOBS
    for name, why in NOT_KNOBS.items():
        assert name not in found, name
        assert why in select.skipped[name], (name, select.skipped[name])


def test_a_real_knob_stays_one_when_a_later_conditional_adjusts_it() -> None:
    # nanoGPT divides gradient_accumulation_steps by the world size under `if ddp:`: a
    # setting, not loop state
    assert "gradient_accumulation_steps" in pool(NANOGPT)


def test_command_line_overrides_are_no_knobs() -> None:
    names, _ = command_overrides("python train.py --batch_size=32", {"train.py": NANOGPT})
    found = pool(NANOGPT, Selection(overridden=frozenset(names)))
    assert "batch_size" not in found and "learning_rate" in found


def test_hundreds_of_proposals_keep_every_value_in_its_range() -> None:
    rng, tried = random.Random(7), set[str]()
    seen: set[str] = set()
    for _ in range(300):
        m = propose({"train.py": NANOGPT}, rng, tried)
        assert m is not None
        tried.add(m.description)
        text = m.files["train.py"]
        values = {c.name: c.value for c in constants("train.py", text)}
        for name, _old, _new in m.changes:
            seen.add(name)
            assert name not in NOT_KNOBS, m.description
        for name in ("beta1", "beta2", "dropout"):
            assert 0 <= values[name] < 1, m.description
        for name in ("batch_size", "n_layer", "n_embd", "block_size", "max_iters"):
            assert isinstance(values[name], int) and values[name] > 0, m.description
        assert values["learning_rate"] > 0 and values["weight_decay"] >= 0
        assert values["n_embd"] % values["n_head"] == 0, m.description  # the model builds
        ast.parse(text)
    assert {"beta1", "beta2", "dropout"} <= seen


@pytest.mark.parametrize(
    ("name", "value", "literal"),
    [
        ("beta2", 0.99, "0.99"),
        ("beta1", 0.9, "0.9"),
        ("dropout", 0.5, "0.5"),
        ("betas[1]", 0.999, "0.999"),
        ("ema_decay", 0.9999, "0.9999"),
        ("momentum", 0.9, "0.9"),
    ],
)
def test_fractions_move_inside_zero_one(name: str, value: float, literal: str) -> None:
    c = Constant("train.py", name, literal, value, 1, 0, len(literal))
    options = neighbours(c)
    assert options, name
    for s in options:
        assert 0 <= float(s) < 1 and float(s) != value, (name, s)


def test_unbounded_names_keep_their_factors() -> None:
    c = Constant("train.py", "learning_rate", "0.9", 0.9, 1, 0, 3)
    assert any(float(s) > 1 for s in neighbours(c))
    assert knobs.bounds("learning_rate") is None and knobs.bounds("--dropout") == (0.0, 1.0)


def test_logging_calls_other_than_print_count_as_logging() -> None:
    text = (
        "import logging\nimport time\nlogger = logging.getLogger()\n"
        "PEAK = 312e12\nREPORT_EVERY = 7\nLR = 0.1\nMAX_SECONDS = 60\n"
        "start = time.perf_counter()\n"
        "for step in range(100):\n"
        "    w = LR * step\n"
        "    if step % REPORT_EVERY == 0:\n"
        "        logger.info('mfu %s', w / PEAK)\n"
        "    if time.perf_counter() - start > MAX_SECONDS:\n"
        "        break\n"
    )
    tree = ast.parse(text)
    why = knobs.not_knobs(tree)
    assert "logging" in why["PEAK"] and "logged or evaluated" in why["REPORT_EVERY"]
    assert "budget" in why["MAX_SECONDS"] and "LR" not in why
    # a schedule's cadence that changes training (no logging in its body) stays a knob
    text2 = (
        "LR = 0.1\nDECAY_EVERY = 30\nfor step in range(100):\n"
        "    if step % DECAY_EVERY == 0:\n        LR = LR\n"
    )
    assert "DECAY_EVERY" not in knobs.not_knobs(ast.parse(text2))


def test_attention_heads_divide_the_width() -> None:
    """nanoGPT's 12 heads of 768: 9 or 15 heads crash at model build (n_embd % n_head), so
    neither is proposed, alone or with a new width; the width moves only where 12 divides it."""
    text = "n_layer = 12\nn_head = 12\nn_embd = 768\n"
    found = pool(text)
    assert found["n_head"] == ["6", "24"], found
    assert all(int(w) % 12 == 0 for w in found["n_embd"]), found
    rng, tried = random.Random(3), set[str]()
    for _ in range(40):
        m = propose({"train.py": text}, rng, tried)
        if m is None:
            break
        tried.add(m.description)
        values = {c.name: c.value for c in constants("train.py", m.files["train.py"])}
        assert values["n_embd"] % values["n_head"] == 0, m.description
    assert knobs.heads_divide({"--num_heads": 8, "hidden_size": 512, "head_dim": 20})
    assert not knobs.heads_divide({"Config.n_head": 9, "n_embd": 768})
