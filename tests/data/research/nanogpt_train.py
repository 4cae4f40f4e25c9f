"""A training script in nanoGPT's shape (written for gpuswarm's tests, not nanoGPT's code):
settings at module level, a configurator that overrides them from the command line, a loop
whose state lives in module-level names, logging cadence, and a time budget (the CPU harness
of issue 29: the run trains for a fixed number of seconds and prints val_bpb)."""

import math
import os
import sys
import time

# I/O
out_dir = "out"
eval_interval = 250
log_interval = 10
eval_iters = 200
eval_only = False
always_save_checkpoint = False
wandb_log = False
# data
dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256
# model
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
# optimizer
learning_rate = 1e-3
max_iters = 5000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
warmup_iters = 100
min_lr = 1e-4
# the harness: seconds of training per run
time_budget = 25.0
peak_flops = 312e12
config_keys = [k for k, v in globals().items() if not k.startswith("_")]
for arg in sys.argv[1:]:  # the configurator: --name=value overrides a setting
    if arg.startswith("--") and "=" in arg:
        key, val = arg[2:].split("=", 1)
        globals()[key] = type(globals()[key])(val)
config = {k: globals()[k] for k in config_keys}

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    gradient_accumulation_steps //= 8
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
print(f"tokens per iteration will be: {tokens_per_iter:,}")

iter_num = 0
best_val_loss = 1e9
running_mfu = -1.0
training_time = 0.0
local_iter_num = 0


def get_lr(it: int) -> float:
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * min(1.0, ratio))) * (learning_rate - min_lr)


def estimate_loss() -> float:
    total = 0.0
    for k in range(eval_iters):
        total += 1.0 / (1 + k + n_layer * n_embd * (1 - dropout) * beta1 * beta2)
    return total / eval_iters


loss = 4.0
t0 = time.time()
while True:
    lr = get_lr(iter_num)
    if iter_num % eval_interval == 0:
        val = estimate_loss()
        print(f"step {iter_num}: val loss {val:.4f}")
        if val < best_val_loss or always_save_checkpoint:
            best_val_loss = val
    for _micro_step in range(gradient_accumulation_steps):
        loss = loss * (1 - lr * weight_decay / grad_clip / batch_size / block_size)
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    training_time += dt
    if iter_num % log_interval == 0:
        mfu = 6 * n_embd * batch_size / max(dt, 1e-9) / peak_flops
        running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
        print(f"iter {iter_num}: loss {loss:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu:.2%}")
    iter_num += 1
    local_iter_num += 1
    if iter_num > max_iters or training_time > time_budget:
        break
print(f"val_bpb: {loss / math.log(2):.6f}")
