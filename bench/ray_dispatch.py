"""8. Ray backend: what dispatching an attempt to a slot actor costs, beside Ray's own best case.

One real multi-node cluster on this machine (``ray.cluster_utils.Cluster``: 3 nodes x 2 fake
GPUs, a raylet each), measured in one run:

(a) dispatch overhead per attempt, one slot (``--gpus 1``), N tasks ``true`` one after the
    other: gpuswarm's in-run figure (first ``started`` to last ``finished`` event of the
    journal, / N: the claim, the start on the actor, the log pulled home, the verdict and the
    durable commit) beside the peer, a plain Ray task (``num_gpus=1``) that runs the same
    ``subprocess.run(["true"])``, N times one after the other (``ray.get`` each): Ray's own
    best case for one subprocess per call, nothing durable. Ratio gpuswarm / Ray;
(b) the idle gap across nodes: 6 slots on 3 nodes, tasks of 1-3 s: per slot, an attempt's
    end to the next one's start (the actors' own clocks, from the attempt records), median
    and p99;
(c) the GPU busy fraction of the same run: per slot, the time its attempts ran over the span
    from its first start to its last end (what gpuswarm controls: the gaps between tasks; the
    last wave's tail, where slots run out of tasks, is in the notes as the makespan figure).
    Target: at least 97%.

Skipped, with a note, without Ray.

    python bench/run.py --only ray            # this benchmark, in the report
    python bench/ray_dispatch.py              # alone, printed (QUICK=1: smaller)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    GPUSWARM,
    Config,
    Row,
    env_for_bench,
    failed,
    have_ray,
    median,
    percentile,
    read_events,
    say,
    skipped,
    the_run,
)

BENCH = "8 ray"
HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 10,
}
NODE: dict[str, Any] = {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 80 << 20}


class Cluster:
    def __init__(self, work: Path) -> None:
        import ray
        from ray.cluster_utils import Cluster as RayCluster

        os.environ["RAY_TMPDIR"] = str(work / "ray")
        (work / "ray").mkdir(parents=True, exist_ok=True)
        self.c: Any = RayCluster(
            initialize_head=True,
            head_node_args={**NODE, "_system_config": HEALTH, "include_dashboard": False},
        )
        for _ in range(2):
            self.c.add_node(**NODE)
        self.c.wait_for_nodes()
        self.address: str = self.c.address
        self.ray: Any = ray

    def peer(self, n: int, max_calls: int) -> list[float]:
        """Seconds per plain Ray task running ``true`` in a subprocess, one after the other.
        ``max_calls`` 0: the worker is reused (Ray's best case); 1: Ray's default for a GPU
        task (a fresh worker process per task, so that GPU memory is freed)."""
        ray = self.ray
        ray.init(address=self.address, log_to_driver=False, logging_level="ERROR")
        try:

            @ray.remote(num_gpus=1, num_cpus=0, max_calls=max_calls)
            def run_true() -> int:
                return subprocess.run(["true"], check=False).returncode

            ray.get(run_true.remote())  # a worker up: not charged to the first call
            out = []
            for _ in range(n):
                t0 = time.perf_counter()
                ray.get(run_true.remote())
                out.append(time.perf_counter() - t0)
            return out
        finally:
            ray.shutdown()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.c.shutdown()
        os.environ.pop("RAY_TMPDIR", None)


def _gpuswarm(work: Path, name: str, lines: list[str], address: str, gpus: str) -> Path:
    cmds = work / f"{name}.txt"
    cmds.write_text("".join(line + "\n" for line in lines))
    ws = work / name
    argv = [*GPUSWARM, "run", "--backend", "ray", "--ray-address", address, "--gpus", gpus]
    argv += ["--plain", "-q", "--no-report", "--workspace", str(ws), str(cmds)]
    proc = subprocess.run(
        argv, env=env_for_bench(), capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"gpuswarm run exited {proc.returncode}: {proc.stderr[-400:]}")
    run = the_run(ws)
    if run is None:
        raise RuntimeError(f"no run under {ws}")
    return run


def _in_run(run: Path, n: int) -> float:
    starts = [e["ts"] for e in read_events(run / "events.jsonl") if e.get("ev") == "started"]
    ends = [e["ts"] for e in read_events(run / "events.jsonl") if e.get("ev") == "finished"]
    return float(max(ends) - min(starts)) / n


def _attempts(run: Path) -> dict[str, list[tuple[float, float]]]:
    """Slot -> (started, ended) of every done attempt, in order."""
    by_slot: dict[str, list[tuple[float, float]]] = {}
    for path in (run / ".parallel" / "done").glob("*.json"):
        for a in json.loads(path.read_text()).get("attempts", []):
            if a.get("started") and a.get("ended"):
                by_slot.setdefault(str(a["slot"]), []).append((a["started"], a["ended"]))
    return {k: sorted(v) for k, v in by_slot.items()}


def run(cfg: Config) -> list[Row]:
    metric_a = "dispatch overhead per attempt, 1 slot"
    if not have_ray():
        return [skipped(BENCH, metric_a, "gpuswarm", "Ray not installed (bench/setup.sh --ray)")]
    n = 20 if cfg.quick else 60
    busy_tasks = 18 if cfg.quick else 36
    work = cfg.work / "ray"
    work.mkdir(parents=True, exist_ok=True)
    say(f"{BENCH}: starting a 3-node Ray cluster (2 fake GPUs each)")
    cluster = Cluster(work)
    rows: list[Row] = []
    try:
        best = cluster.peer(n, 0)
        fresh = cluster.peer(max(5, n // 6), 1)
        rdisp = _gpuswarm(work, "dispatch", ["true"] * n, cluster.address, "1")
        ours = _in_run(rdisp, n)
        theirs = statistics_mean(best)
        rows.append(
            Row(
                BENCH, f"{metric_a} ({n} x true)", "gpuswarm", ours * 1000, "ms",
                ratio=f"{ours / theirs:.1f}x Ray's best case", note="journal: first started "
                "to last finished / N (start on the actor, log home, verdict, durable commit)",
            )
        )  # fmt: skip
        rows.append(
            Row(
                BENCH, f"{metric_a} ({n} x true)", "Ray", theirs * 1000, "ms",
                note=f"plain Ray task (num_gpus=1, max_calls=0: worker reused), subprocess.run"
                f"(['true']), ray.get each; median {median(best) * 1000:.1f} ms",
            )
        )  # fmt: skip
        rows.append(
            Row(
                BENCH, f"{metric_a} ({len(fresh)} x true)", "Ray (GPU default)",
                statistics_mean(fresh) * 1000, "ms",
                ratio=f"gpuswarm {statistics_mean(fresh) / ours:.0f}x faster",
                note="the same task with Ray's default for GPU tasks (max_calls=1: a new "
                "worker process per task)",
            )
        )  # fmt: skip
        rng = random.Random(16)
        lines = [f"sleep {rng.uniform(1.0, 3.0):.2f}" for _ in range(busy_tasks)]
        rbusy = _gpuswarm(work, "busy", lines, cluster.address, "auto")
        rows.extend(_busy_rows(rbusy, busy_tasks))
    except Exception as exc:  # one failure must not lose the other benchmarks
        rows.append(failed(BENCH, metric_a, "gpuswarm", exc))
    finally:
        cluster.stop()
    return rows


def statistics_mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _busy_rows(run: Path, tasks: int) -> list[Row]:
    slots = _attempts(run)
    gaps = [b[0] - a[1] for seq in slots.values() for a, b in itertools.pairwise(seq)]
    busy = []
    for seq in slots.values():
        span = seq[-1][1] - seq[0][0]
        busy.append(sum(e - s for s, e in seq) / span if span > 0 else 1.0)
    frac = sum(busy) / len(busy)
    first = min(s for seq in slots.values() for s, _ in seq)
    last = max(e for seq in slots.values() for _, e in seq)
    total = sum(e - s for seq in slots.values() for s, e in seq)
    makespan = total / (len(slots) * (last - first))
    nodes = {label.split("-")[-2] for label in slots}
    where = f"{len(slots)} slots on {len(nodes)} nodes, {tasks} tasks of 1-3 s"
    return [
        Row(
            BENCH, f"idle gap across nodes ({where})", "gpuswarm", median(gaps) * 1000, "ms",
            shown=f"{median(gaps) * 1000:.0f} / {percentile(gaps, 99) * 1000:.0f}",
            note="median / p99 ms, an attempt's end to the next start on its slot",
        ),
        Row(
            BENCH, f"GPU busy fraction ({where})", "gpuswarm", frac * 100, "%",
            target=">= 97%", ok=frac >= 0.97,
            note=f"per slot, first start to last end; over the makespan (last wave's tail "
            f"included) {makespan * 100:.1f}%",
        ),
    ]  # fmt: skip


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    with tempfile.TemporaryDirectory() as tmp:
        for row in run(Config.make(bool(os.environ.get("QUICK")), Path(tmp))):
            print(row)
