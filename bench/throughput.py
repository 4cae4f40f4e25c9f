"""Throughput of no-op tasks: gpuswarm (durable queue, fsync on) beside xargs -P and GNU parallel.

    python bench/throughput.py [--tasks 2000] [--gpus 8]

Prints one table with tasks/s and the ratio of gpuswarm to each peer. Peers that are not
installed are skipped (GNU parallel: `apt-get install parallel`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(argv: list[str], stdin: str | None = None, cwd: Path | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(
        argv,
        input=stdin,
        text=True,
        check=True,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - start


def gpuswarm(n: int, gpus: int, work: Path) -> float:
    (work / "cmds.txt").write_text("true\n" * n)
    argv = [
        sys.executable,
        "-m",
        "gpuswarm",
        "run",
        "-q",
        "--gpus",
        f"sim:{gpus}",
        "--workspace",
        str(work / "runs"),
        str(work / "cmds.txt"),
    ]
    elapsed = timed(argv)
    (run,) = (work / "runs" / "cmds").glob("run_*")
    assert json.loads((run / "summary.json").read_text())["counts"]["done"] == n
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    n, g = args.tasks, args.gpus
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(("gpuswarm (durable)", n / gpuswarm(n, g, Path(tmp))))
    rows.append(("xargs -P", n / timed(["xargs", "-P", str(g), "-n", "1", "true"], "x\n" * n)))
    if shutil.which("parallel"):
        recipe = ["parallel", "-j", str(g), "CUDA_VISIBLE_DEVICES=$(({%}-1)) true", ":::"]
        rows.append(("GNU parallel", n / timed([*recipe, *map(str, range(n))])))
    ours = rows[0][1]
    print(f"{n} no-op tasks on {g} (simulated) GPUs")
    print(f"{'runner':<22}{'tasks/s':>10}{'gpuswarm / runner':>20}")
    for name, rate in rows:
        print(f"{name:<22}{rate:>10.0f}{ours / rate:>20.2f}")


if __name__ == "__main__":
    main()
