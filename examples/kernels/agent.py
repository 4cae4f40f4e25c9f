"""A stand-in for an AI agent optimising one GPU kernel (no GPU, no LLM needed).

gpuswarm runs one copy per task on its own (simulated) GPU. Like a real agent it reads the task
folder's config.yaml, "works" for a while, prints progress, and writes task_result.yaml into its
workspace; gpuswarm counts the task done only when that file exists and parses.
"""

import os
import random
import sys
import time
from pathlib import Path


def read_config(path: Path) -> dict[str, str]:
    # Tiny "key: value" reader so the example needs nothing but Python.
    out = {}
    for line in path.read_text().splitlines():
        if ":" in line and not line.lstrip().startswith("#"):
            key, value = line.split(":", 1)
            out[key.strip()] = value.strip()
    return out


def main() -> int:
    task_dir, workspace = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = read_config(task_dir / "config.yaml")
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "?")
    attempt = int(os.environ.get("GPUSWARM_ATTEMPT", "1"))
    print(f"agent: optimising {cfg['kernel']} on GPU {gpu} (attempt {attempt})", flush=True)
    if cfg.get("flaky") == "true" and attempt == 1:
        print("agent: lost the connection to the model API", file=sys.stderr)
        return 1  # the first attempt crashes; gpuswarm retries it (max_attempts: 2)
    rng = random.Random(cfg["kernel"])
    for step in range(1, 4):
        time.sleep(float(cfg.get("work_seconds", "1")) / 3)
        print(f"\rstep {step}/3", end="", flush=True)
    print()
    baseline = float(cfg["baseline_ms"])
    speedup = round(rng.uniform(0.9, 2.5), 3)
    correct = cfg.get("broken") != "true"
    print(f"speedup: {speedup}")
    (workspace / "task_result.yaml").write_text(
        f"kernel: {cfg['kernel']}\n"
        f"compiled: true\n"
        f"pass_correctness: {'true' if correct else 'false'}\n"
        f"baseline_ms: {baseline}\n"
        f"optimized_ms: {round(baseline / speedup, 4)}\n"
        f"speedup: {speedup}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
