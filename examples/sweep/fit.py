"""One point of a hyper-parameter sweep: fit y = 3x - 2 + noise by gradient descent.

Writes result.json (the run's completion file) into the task's workspace and prints
``final_loss:`` for the metric pattern. Pure Python: runs anywhere in well under a second.
"""

import argparse
import json
import os
import random
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--out", type=Path, required=True)
args = parser.parse_args()

rng = random.Random(args.seed)
xs = [rng.uniform(-1, 1) for _ in range(256)]
ys = [3 * x - 2 + rng.gauss(0, 0.1) for x in xs]
w = b = 0.0
loss = float("inf")
for _ in range(args.steps):
    gw = gb = loss = 0.0
    for x, y in zip(xs, ys, strict=True):
        err = w * x + b - y
        loss += err * err / len(xs)
        gw += 2 * err * x / len(xs)
        gb += 2 * err / len(xs)
    w, b = w - args.lr * gw, b - args.lr * gb
diverged = loss != loss or loss > 1e6
print(f"gpu {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}: lr={args.lr} steps={args.steps}")
print(f"final_loss: {loss:.6f}")
args.out.mkdir(parents=True, exist_ok=True)
result = {
    "lr": args.lr,
    "steps": args.steps,
    "loss": loss,
    "w": w,
    "b": b,
    "converged": not diverged and loss < 0.05,
}
(args.out / "result.json").write_text(json.dumps(result))
