"""A tiny character-level language model in pure numpy, trained for a fixed wall-clock budget.

Bengio-style MLP: the embeddings of the last CONTEXT characters, concatenated -> one tanh
hidden layer -> softmax over the characters; manual backprop, AdamW, warmup then linear decay.
This is the file the experiment loop edits; prepare.py (data, time budget, metric) is fixed.
"""

import os
import sys
import time

started = time.perf_counter()
sys.dont_write_bytecode = True  # leave no __pycache__ in the experiment's repository
os.environ["OMP_NUM_THREADS"] = "1"  # several variants share the CPU cores: one thread each
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import math  # noqa: E402
import resource  # noqa: E402

import numpy as np  # noqa: E402
import prepare  # noqa: E402

LEARNING_RATE = 0.002  # peak AdamW learning rate
BATCH_SIZE = 64  # characters predicted per step
CONTEXT = 8  # characters of context the model sees (at most prepare.SEQ_LEN)
EMBED_DIM = 16  # size of each character's embedding
HIDDEN_DIM = 128  # width of the tanh hidden layer
INIT_SCALE = 2.0  # multiplier of the initial weights (1.0: the usual 1/sqrt(fan_in))
WEIGHT_DECAY = 0.01  # decoupled weight decay of the matrices
WARMUP_FRAC = 0.05  # share of the time budget spent warming the learning rate up
FINAL_LR_FRAC = 0.1  # learning rate at the end of the budget, as a share of the peak


def init_params(vocab_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    fan_in = CONTEXT * EMBED_DIM
    shapes = {
        "emb": ((vocab_size, EMBED_DIM), 1.0),
        "w1": ((fan_in, HIDDEN_DIM), 1.0 / math.sqrt(fan_in)),
        "b1": ((HIDDEN_DIM,), 0.0),
        "w2": ((HIDDEN_DIM, vocab_size), 0.0),  # zero: the first prediction is uniform
        "b2": ((vocab_size,), 0.0),
    }
    return {
        name: (rng.standard_normal(shape) * std * INIT_SCALE).astype(np.float32)
        for name, (shape, std) in shapes.items()
    }


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Logits of the next character after each row of ``x`` (the last CONTEXT ids are used)."""
    x = x[:, -CONTEXT:]
    a = params["emb"][x].reshape(len(x), -1)
    h = np.tanh(a @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"], x, a, h


def loss_and_grads(
    params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    logits, x, a, h = forward(params, x)
    n = len(y)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    loss = float(np.mean(np.log(total[:, 0]) - shifted[np.arange(n), y]))
    dlogits = exp / total
    dlogits[np.arange(n), y] -= 1.0
    dlogits /= n
    dh = (dlogits @ params["w2"].T) * (1.0 - h * h)
    da = (dh @ params["w1"].T).reshape(-1, EMBED_DIM)
    onehot = np.zeros((da.shape[0], len(params["b2"])), dtype=np.float32)
    onehot[np.arange(da.shape[0]), x.ravel()] = 1.0
    grads = {
        "emb": onehot.T @ da,
        "w1": a.T @ dh,
        "b1": dh.sum(axis=0),
        "w2": h.T @ dlogits,
        "b2": dlogits.sum(axis=0),
    }
    return loss, grads


def lr_at(progress: float) -> float:
    """Learning rate at ``progress`` (share of the time budget spent, 0..1)."""
    if progress < WARMUP_FRAC:
        return LEARNING_RATE * progress / WARMUP_FRAC
    rest = (progress - WARMUP_FRAC) / max(1.0 - WARMUP_FRAC, 1e-9)
    return LEARNING_RATE * (1.0 - (1.0 - FINAL_LR_FRAC) * min(rest, 1.0))


def main() -> int:
    data = prepare.load()
    rng = np.random.default_rng(1337)
    params = init_params(data.vocab_size, rng)
    m = {name: np.zeros_like(p) for name, p in params.items()}  # Adam's first moments
    v = {name: np.zeros_like(p) for name, p in params.items()}  # and second moments
    num_params = sum(p.size for p in params.values())
    budget = prepare.TIME_BUDGET
    beta1, beta2 = 0.9, 0.99  # Adam's moment decays

    step = 0
    smooth = None
    start = time.perf_counter()
    last_print = start
    report_at = budget / 10  # a progress line every tenth of the budget (gpuswarm's pruning)
    while True:
        now = time.perf_counter()
        elapsed = now - start
        if elapsed >= budget:
            break
        if elapsed >= report_at:
            bpb = prepare.progress_bpb(lambda ctx: forward(params, ctx)[0])
            print(f"\nprogress: elapsed={elapsed:.3f} val_bpb={bpb:.6f}", flush=True)
            report_at += budget / 10
            start += time.perf_counter() - now  # the evaluation is not training time
            continue
        lr = lr_at(elapsed / budget)
        x, y = prepare.get_batch("train", BATCH_SIZE, rng, CONTEXT)
        loss, grads = loss_and_grads(params, x, y)
        if not math.isfinite(loss) or loss > 100:
            print("\nFAIL")
            return 1
        step += 1
        c1 = 1.0 - beta1**step
        c2 = 1.0 - beta2**step
        for name, p in params.items():
            g = grads[name]
            m[name] *= beta1
            m[name] += (1.0 - beta1) * g
            v[name] *= beta2
            v[name] += (1.0 - beta2) * g * g
            if p.ndim == 2:
                p *= 1.0 - lr * WEIGHT_DECAY
            p -= (lr / c1) * m[name] / (np.sqrt(v[name] / c2) + 1e-8)
        smooth = loss if smooth is None else 0.95 * smooth + 0.05 * loss
        if now - last_print >= 0.5:
            last_print = now
            print(
                f"\rstep {step:05d} ({100 * elapsed / budget:5.1f}%) | loss {smooth:.4f} "
                f"| lr {lr:.2e} | {elapsed:.1f}s",
                end="",
                flush=True,
            )
    training_seconds = time.perf_counter() - start

    val_bpb = prepare.evaluate_bpb(lambda ctx: forward(params, ctx)[0])
    if not math.isfinite(val_bpb):
        print("\nFAIL")
        return 1
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print()
    print("---")
    print(f"val_bpb:          {val_bpb:.6f}")
    print(f"training_seconds: {training_seconds:.1f}")
    print(f"total_seconds:    {time.perf_counter() - started:.1f}")
    print(f"peak_vram_mb:     {peak_mb:.1f}")
    print(f"num_steps:        {step}")
    print(f"num_params_M:     {num_params / 1e6:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
