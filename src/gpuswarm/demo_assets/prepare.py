"""Fixed evaluation harness of the gpuswarm demo: data, batches and the metric.

Read-only for the experiment loop: variants edit train.py only, so every variant is measured
by the same ``evaluate_bpb`` on the same validation characters.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TIME_BUDGET = float(os.environ.get("GPUSWARM_DEMO_BUDGET", "4.0"))  # seconds of training
SEQ_LEN = 16  # characters of context the harness hands to the model (train.CONTEXT <= this)
VAL_FRACTION = 0.15  # share of the corpus held out for validation
VAL_BLOCK = 400  # the split alternates blocks of this many characters
EVAL_POSITIONS = 6000  # validation characters scored by evaluate_bpb (fixed, evenly spread)
EVAL_BATCH = 2000  # positions per predict_fn call during evaluation
PROGRESS_STRIDE = 4  # progress_bpb scores every 4th evaluation position (quick)

CORPUS = Path(__file__).resolve().with_name("corpus.txt")


@dataclass(frozen=True)
class Data:
    vocab: str  # the sorted distinct characters of the corpus
    ids: np.ndarray  # the corpus as vocab indices (int64)
    train_pos: np.ndarray  # target positions of the training split (each has SEQ_LEN context)
    val_pos: np.ndarray  # target positions of the validation split

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def load_corpus() -> str:
    """The corpus text (plain ASCII), read from the folder of this file."""
    return CORPUS.read_text(encoding="ascii")


def build_vocab(text: str) -> str:
    """The sorted distinct characters of ``text``."""
    return "".join(sorted(set(text)))


def encode(text: str, vocab: str) -> np.ndarray:
    """``text`` as int64 indices into ``vocab``."""
    table = {ch: i for i, ch in enumerate(vocab)}
    return np.fromiter((table[ch] for ch in text), dtype=np.int64, count=len(text))


def split_positions(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic train/val target positions of a text of ``n`` characters.

    The text is cut into blocks of VAL_BLOCK characters; block k is validation when
    floor((k + 1) * VAL_FRACTION) > floor(k * VAL_FRACTION), so about VAL_FRACTION of the blocks
    are, spread evenly over the whole corpus. The first SEQ_LEN characters are never targets.
    """
    pos = np.arange(SEQ_LEN, n)
    block = pos // VAL_BLOCK
    is_val = np.floor((block + 1) * VAL_FRACTION) > np.floor(block * VAL_FRACTION)
    return pos[~is_val], pos[is_val]


@functools.lru_cache(maxsize=1)
def load() -> Data:
    """The corpus, its vocabulary and its split (cached)."""
    text = load_corpus()
    vocab = build_vocab(text)
    ids = encode(text, vocab)
    train_pos, val_pos = split_positions(len(ids))
    return Data(vocab, ids, train_pos, val_pos)


def contexts(positions: np.ndarray, context: int = SEQ_LEN) -> np.ndarray:
    """The ``context`` characters before each target position, shape (len(positions), context)."""
    ids = load().ids
    return ids[positions[:, None] + np.arange(-context, 0)]


def get_batch(
    split: str, batch_size: int, rng: np.random.Generator, context: int = SEQ_LEN
) -> tuple[np.ndarray, np.ndarray]:
    """A random batch of ``split`` ("train" or "val"): contexts (B, context) and targets (B,)."""
    if not 1 <= context <= SEQ_LEN:
        raise ValueError(f"context must be in 1..{SEQ_LEN}, not {context}")
    data = load()
    pool = data.train_pos if split == "train" else data.val_pos
    positions = pool[rng.integers(0, len(pool), size=batch_size)]
    return contexts(positions, context), data.ids[positions]


@functools.lru_cache(maxsize=1)
def eval_positions() -> np.ndarray:
    """The fixed validation positions scored by evaluate_bpb."""
    val_pos = load().val_pos
    if len(val_pos) <= EVAL_POSITIONS:
        return val_pos
    return val_pos[np.linspace(0, len(val_pos) - 1, EVAL_POSITIONS).round().astype(np.int64)]


def progress_bpb(predict_fn: Callable[[np.ndarray], np.ndarray]) -> float:
    """evaluate_bpb on every PROGRESS_STRIDE-th of its positions: a quick intermediate value
    for the progress lines train.py prints while it trains (``progress: elapsed=.. val_bpb=..``)."""
    return evaluate_bpb(predict_fn, eval_positions()[::PROGRESS_STRIDE])


def evaluate_bpb(
    predict_fn: Callable[[np.ndarray], np.ndarray], positions: np.ndarray | None = None
) -> float:
    """Bits per byte (= per character: the corpus is ASCII) of a model on the validation set.

    ``predict_fn`` maps contexts of shape (N, SEQ_LEN) (int64 vocab indices, oldest first) to
    logits of shape (N, vocab_size); the log-softmax is taken here, stably, in float64.
    ``positions``: the fixed evaluation positions unless given (progress_bpb's subset).
    """
    data = load()
    positions = eval_positions() if positions is None else positions
    total = 0.0
    for start in range(0, len(positions), EVAL_BATCH):
        chunk = positions[start : start + EVAL_BATCH]
        logits = np.asarray(predict_fn(contexts(chunk)), dtype=np.float64)
        if logits.shape != (len(chunk), data.vocab_size):
            raise ValueError(f"predict_fn returned shape {logits.shape}")
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        total -= float(log_probs[np.arange(len(chunk)), data.ids[chunk]].sum())
    return total / len(positions) / math.log(2)
