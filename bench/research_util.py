"""5. Research loop utilisation (simulated), async mode beside rounds mode.

A scratch git repository holds ``bench/fixtures/research/train.py``: it sleeps 5-15 s (drawn
from a RNG seeded with its own content, so each variant has its own reproducible duration) and
prints ``val_bpb`` / ``peak_vram_mb``. The proposer is the ``agent`` proposer running
``bench/fixtures/research/fake_agent.py``: it thinks 1-3 s (seeded by the prompt number, so both
modes see the same proposals) and edits ``LR`` in train.py. With --quick every time is x0.1
(``GPUSWARM_BENCH_SCALE``). For each mode, in a fresh repository::

    gpuswarm research init --tag bench --edit train.py --command 'python train.py' \\
        --metric val_bpb --goal min --gpus sim:4 --mode MODE --linger 5s
    gpuswarm research loop --proposer agent --agent-command 'python fake_agent.py' \\
        --mode MODE --max-experiments 24 --proposers 4 --json   # timed: wall clock

GPU busy fraction = sum of attempt durations (``attempts[].started/ended`` of every descriptor in
the core run's done/ and failed/) / (slots x (last end - first start)); the notes add the same
fraction up to the last start (before the budget is spent and the slots drain). Experiments per
hour = variants run (the baseline left out) / the loop's wall time.

Three loops: async and rounds with 24 experiments each (experiments/hour side by side), then
async alone with 100 (the seed's night: "about 100 experiments while you sleep") for the busy
target. Every loop has a ramp-up (slots wait for the first proposals) and a drain (after the last
start the budget is spent and runs end one by one): fixed costs, a share that shrinks as the loop
grows, so the busy target is taken on a loop of a realistic length; the short loops' busy
fractions are shown too.
"""

from __future__ import annotations

import itertools
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import BENCH_DIR, GPUSWARM, Config, Row, env_for_bench, failed, median, say

BENCH = "5 research loop"
FIXTURES = BENCH_DIR / "fixtures" / "research"
TAG = "bench"


def make_repo(where: Path) -> Path:
    repo = where / "repo"
    repo.mkdir(parents=True)
    shutil.copy(FIXTURES / "train.py", repo / "train.py")
    for argv in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "bench@example.invalid"],
        ["config", "user.name", "bench"],
        ["add", "train.py"],
        ["commit", "-q", "-m", "base"],
    ):
        subprocess.run(["git", *argv], cwd=repo, check=True, capture_output=True)
    return repo


def _gs(args: list[str], env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(
        [*GPUSWARM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        raise RuntimeError(f"gpuswarm {args[0]} {args[1]} exited {proc.returncode}: {tail}")
    return proc.stdout


def loop_once(cfg: Config, mode: str, experiments: int, label: str) -> dict[str, Any]:
    where = cfg.work / "research" / label
    shutil.rmtree(where, ignore_errors=True)
    repo = make_repo(where)
    env = env_for_bench(GPUSWARM_BENCH_SCALE=f"{cfg.research_scale:g}")
    train = f"{shlex.quote(sys.executable)} train.py"
    agent = f"{shlex.quote(sys.executable)} {shlex.quote(str(FIXTURES / 'fake_agent.py'))}"
    slots = cfg.research_slots
    init = ["research", "init", "--tag", TAG, "--edit", "train.py", "--command", train]
    init += ["--metric", "val_bpb", "--goal", "min", "--gpus", f"sim:{slots}", "--mode", mode]
    _gs([*init, "--linger", "5s", "-C", str(repo)], env, 120)
    loop = ["research", "loop", "--proposer", "agent", "--agent-command", agent, "--mode", mode]
    loop += ["--max-experiments", str(experiments), "--json", "-C", str(repo)]
    loop += ["--proposers", str(slots)]  # one agent per GPU, as with real LLM agents
    t0 = time.perf_counter()
    try:
        out = _gs(loop, env, 3600)
        wall = time.perf_counter() - t0
    finally:
        subprocess.run(
            [*GPUSWARM, "research", "stop", "-C", str(repo)],
            capture_output=True,
            env=env,
            timeout=120,
            check=False,
        )
    data = json.loads(out) if out.strip().startswith("{") else {}
    got = {"wall": wall, "loop": data, **busy_fraction(repo, slots)}
    return {**got, "proposal_interval": proposal_interval(repo)}


def busy_fraction(repo: Path, slots: int) -> dict[str, Any]:
    runs = list((repo / ".gpuswarm" / "research" / TAG / "queue").glob("run_*"))
    if len(runs) != 1:
        raise RuntimeError(f"expected one core run, found {len(runs)}")
    spans: list[tuple[float, float]] = []
    by_slot: dict[str, list[tuple[float, float]]] = {}
    variants = baselines = 0
    for state in ("done", "failed"):
        for path in (runs[0] / ".parallel" / state).glob("*.json"):
            data = json.loads(path.read_text())
            if data.get("task", {}).get("priority") == 10:
                baselines += 1
            else:
                variants += 1
            for a in data.get("attempts", []):
                if not a.get("interrupted") and a.get("started") and a.get("ended"):
                    span = (float(a["started"]), float(a["ended"]))
                    spans.append(span)
                    by_slot.setdefault(str(a.get("slot")), []).append(span)
    if not spans:
        raise RuntimeError("no finished attempt in the core run")
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    busy = sum(e - s for s, e in spans)
    fed = max(s for s, _ in spans)  # the last start: after it the budget is spent, slots drain
    busy_fed = sum(max(0.0, min(e, fed) - s) for s, e in spans)
    # idle slot-seconds: before a slot's first start (ramp-up: the baseline is queued with the
    # first proposal), after its last end (drain: the budget is spent), and in between
    ramp = sum(min(s for s, _ in v) - first for v in by_slot.values()) + (slots - len(by_slot)) * (
        last - first
    )
    drain = sum(last - max(e for _, e in v) for v in by_slot.values())
    return {
        "busy": busy / (slots * (last - first)),
        "idle_ramp_s": ramp,
        "idle_drain_s": drain,
        "idle_between_s": slots * (last - first) - busy - ramp - drain,
        "busy_until_last_start": busy_fed / (slots * (fed - first)) if fed > first else 0.0,
        "variants": variants,
        "baselines": baselines,
        "mean_run_s": busy / len(spans),
        "span_s": last - first,
    }


def run(cfg: Config) -> list[Row]:
    n, g = cfg.research_experiments, cfg.research_slots
    times = f"runs {5 * cfg.research_scale:g}-{15 * cfg.research_scale:g} s, proposer "
    times += f"{cfg.research_scale:g}-{3 * cfg.research_scale:g} s"
    got: dict[str, dict[str, Any]] = {}
    rows: list[Row] = []
    runs = [("async", n, "async"), ("rounds", n, "rounds"), ("async", cfg.research_long, "long")]
    for mode, count, label in runs:
        say(f"research loop: {mode} mode, {count} experiments")
        try:
            got[label] = loop_once(cfg, mode, count, label)
        except Exception as exc:
            size = f"{count} experiments on sim:{g} ({times})"
            rows.append(failed(BENCH, f"{size}: GPU busy, %", f"gpuswarm {mode}", exc))
    for label, r in got.items():
        mode = "rounds" if label == "rounds" else "async"
        count = cfg.research_long if label == "long" else n
        size = f"{count} experiments on sim:{g} ({times})"
        per_hour = r["variants"] / r["wall"] * 3600
        r["per_hour"] = per_hour
        busy = r["busy"] * 100
        row = Row(BENCH, f"{size}: GPU busy, %", f"gpuswarm {mode}", busy, "%")
        row.note = (
            f"{r['variants']} variants + {r['baselines']} baseline in {r['wall']:.0f} s; "
            f"mean run {r['mean_run_s']:.1f} s; {r['busy_until_last_start'] * 100:.1f}% "
            f"until the last start; {_why_idle(r, g, cfg.research_scale)}"
        )
        row.extra = {k: v for k, v in r.items() if k != "loop"}
        if label == "long":  # the target: a loop as long as the seed's night (~100 runs)
            row.target, row.ok = ">= 97%", busy >= 97
        rows.append(row)
        if label != "long":
            rows.append(Row(BENCH, f"{size}: experiments/hour", f"gpuswarm {mode}", per_hour, "/h"))
    if "async" in got and "rounds" in got:
        gain = got["async"]["per_hour"] / got["rounds"]["per_hour"]
        for row in rows:
            if row.tool == "gpuswarm async" and row.unit == "/h":
                row.target, row.ok, row.ratio = "async >= 1.3x rounds", gain >= 1.3, f"{gain:.2f}x"
    return rows


def proposal_interval(repo: Path) -> float | None:
    """Median seconds between consecutive proposed variants (ledger ``variant`` events)."""
    ledger = repo / ".gpuswarm" / "research" / TAG / "ledger.jsonl"
    stamps = []
    for line in ledger.read_text().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("ev") == "variant" and ev.get("kind") == "variant":
            stamps.append(float(ev["ts"]))
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return median(gaps) if gaps else None


def _why_idle(r: dict[str, Any], slots: int, scale: float) -> str:
    """Where the idle slot-seconds are."""
    total = slots * r["span_s"]
    idle = total * (1 - r["busy"])
    interval = r.get("proposal_interval")
    pace = f"; median {interval:.1f} s between proposals" if interval else ""
    return (
        f"idle {idle:.1f} of {total:.0f} slot-seconds: ramp-up {r['idle_ramp_s']:.1f} (slots "
        f"waiting for the first proposals, {scale:g}-{3 * scale:g} s), end drain "
        f"{r['idle_drain_s']:.1f} (the budget spent, runs ending one by one), in between "
        f"{r['idle_between_s']:.1f}{pace}"
    )
