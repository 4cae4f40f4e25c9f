"""Ray as a peer: ``num_gpus=1`` tasks on declared (fake) GPUs, run in a child process.

    python bench/ray_peer.py throughput --cmds cmds.txt --gpus 8 --repeats 3
    python bench/ray_peer.py run --cmds cmds.txt --gpus 4

Each task runs one line of ``cmds`` with ``subprocess.run(line, shell=True)``; Ray sets
``CUDA_VISIBLE_DEVICES`` to the GPU it assigned. Tasks declare ``num_cpus=0`` (else a 2-core
machine would run 2 at a time) and ``max_calls=0``: Ray's default for GPU tasks (``max_calls=1``)
starts a fresh worker process per task, about a second each on a small machine; reusing workers
is Ray's best case. The last stdout line is a JSON object with the timings.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import BENCH_DIR, env_for_bench


def call_ray(args: list[str], timeout: float) -> dict[str, Any]:
    """Run this script in a child interpreter and return its JSON line."""
    proc = subprocess.run(
        [sys.executable, str(BENCH_DIR / "ray_peer.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env_for_bench(RAY_AUTH_MODE="disabled", LC_ALL="C"),
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-2:]
        raise RuntimeError(f"ray_peer exited {proc.returncode}: {' | '.join(tail)}")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["throughput", "run"])
    parser.add_argument("--cmds", type=Path, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    lines = [ln for ln in args.cmds.read_text().splitlines() if ln.strip()]

    import ray

    start = time.perf_counter()
    ray.init(
        num_cpus=2,
        num_gpus=args.gpus,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    init_s = time.perf_counter() - start

    @ray.remote(num_gpus=1, num_cpus=0, max_calls=0)
    def task(line: str) -> int:
        return subprocess.run(line, shell=True, check=False).returncode

    try:
        ray.get([task.remote("true") for _ in range(args.gpus)])  # workers up before timing
        seconds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            codes = ray.get([task.remote(line) for line in lines])
            seconds.append(time.perf_counter() - t0)
            if any(codes):
                raise SystemExit(f"{sum(1 for c in codes if c)} tasks failed")
    finally:
        ray.shutdown()
    print(json.dumps({"init_s": init_s, "seconds": seconds, "tasks": len(lines)}))


if __name__ == "__main__":
    main()
