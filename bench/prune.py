"""10. Research pruning (issue 38): experiments/hour with ``--prune median`` beside ``off``.

The embedded demo (``gpuswarm demo``'s repository: the numpy character model, ``train.py``
printing a progress line every tenth of its budget) is set up as the demo sets it up, twice,
and the same loop runs on each, one after the other in this one run::

    gpuswarm research init --tag demo --edit train.py --protect prepare.py \\
        --command 'python train.py' --metric val_bpb --goal min --gpus sim:2 --timeout 60s
    gpuswarm research loop --proposer mutate --seed 7 --mode async --max-experiments N \\
        --prune off|median --json                      # timed: wall clock

with ``GPUSWARM_DEMO_BUDGET`` seconds of training per run. Experiments/hour = the loop's
experiments (variants, confirmation re-runs and re-based combinations: what
``--max-experiments`` counts; baselines and BASE's control runs are extra) / its wall time; the
ratio is median's over off's. The final best is BASE's metric at the end of each loop (lower is
better); the off arm's ledger is also replayed with ``--prune median`` (what the rule would
have stopped on exactly those runs, and whether the best would have changed), and its ceiling
is computed: an oracle that knew each run's end and stopped every variant that ended
``discard`` at the grace (20% of its run) would have saved that share of its GPU time, and
experiments/hour could have grown by at most ``gpu_s / (gpu_s - saved)`` (confirmation re-runs
and BASE's controls are never stopped, by any rule). Both arms start from the same seed, so they
propose the same variants until their decisions differ.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

from common import GPUSWARM, Config, Row, env_for_bench, failed, say

BENCH = "10 research pruning"
TAG = "demo"
SEED = 7
SLOTS = 2


def _gs(args: list[str], env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(
        [*GPUSWARM, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        raise RuntimeError(f"gpuswarm {args[0]} {args[1]} exited {proc.returncode}: {tail}")
    return proc.stdout


def _sizes(cfg: Config) -> tuple[int, float]:
    """(experiments per arm, seconds of training per run)."""
    return (10, 2.0) if cfg.quick else (30, 6.0)


def arm(cfg: Config, rule: str) -> dict[str, Any]:
    from gpuswarm.cli.demo import make_repo

    where = cfg.work / "prune" / rule
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    repo = make_repo(where)
    n, budget = _sizes(cfg)
    env = env_for_bench(GPUSWARM_DEMO_BUDGET=f"{budget:g}")
    train = f"{shlex.quote(sys.executable)} train.py"
    init = ["research", "init", "-C", str(repo), "--tag", TAG, "--edit", "train.py"]
    init += ["--protect", "prepare.py", "--command", train, "--metric", "val_bpb"]
    init += ["--goal", "min", "--gpus", f"sim:{SLOTS}", "--timeout", "60s", "--linger", "5s"]
    _gs(init, env, 120)
    loop = ["research", "loop", "-C", str(repo), "--proposer", "mutate", "--seed", str(SEED)]
    loop += ["--mode", "async", "--max-experiments", str(n), "--prune", rule, "--json"]
    t0 = time.perf_counter()
    try:
        out = _gs(loop, env, 3600)
        wall = time.perf_counter() - t0
    finally:
        stop = [*GPUSWARM, "research", "stop", "-C", str(repo)]
        subprocess.run(stop, capture_output=True, env=env, timeout=120, check=False)
    data = json.loads(out)
    ledger = repo / ".gpuswarm" / "research" / TAG / "ledger.jsonl"
    events = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    kinds = {e["id"]: e["kind"] for e in events if e["ev"] == "variant"}
    decided = [e for e in events if e["ev"] == "decided" and e["status"] != "withdrawn"]
    experiments = sum(1 for e in decided if kinds.get(e["id"]) in ("variant", "combo", "confirm"))
    got = {
        "wall": wall,
        "experiments": experiments,
        "runs": len(decided),
        "per_hour": experiments / wall * 3600,
        "best": data.get("best"),
        "pruned": data.get("pruned", 0),
        "gpu_saved_s": data.get("gpu_saved_s", 0.0),
        "kept": data.get("kept"),
    }
    if rule == "off":  # what the rule would have stopped on these very runs (k 3, and k 2)
        replay = ["research", "log", "-C", str(repo), "--policy", "noise-aware"]
        replay += ["--prune", "median", "--json"]
        got["replay"] = json.loads(_gs(replay, env, 300)).get("pruning")
        got["replay_k2"] = json.loads(_gs([*replay, "--prune-k", "2"], env, 300)).get("pruning")
    got["gpu_s"] = _gpu_seconds(events)
    got["oracle"] = oracle(events)
    return got


GRACE = 0.2  # the loop's default --prune-grace


def oracle(events: list[dict[str, Any]], grace: float = GRACE) -> dict[str, float]:
    """The most any stopping rule could have saved on these runs: every variant or re-based
    combination that ended ``discard``, stopped at ``grace`` of its run (an upper bound: the
    start-up and the evaluation before that point are counted as saved too). ``ceiling``: the
    experiments/hour ratio that would give, the same runs otherwise."""
    kinds = {e["id"]: e["kind"] for e in events if e["ev"] == "variant"}
    status = {e["id"]: e["status"] for e in events if e["ev"] == "decided"}
    losers = [
        float(e["seconds"])
        for e in events
        if e["ev"] == "finished"
        and kinds.get(e["id"]) in ("variant", "combo")
        and status.get(e["id"]) == "discard"
        and isinstance(e.get("seconds"), int | float)
    ]
    total = _gpu_seconds(events)
    saved = sum(s * (1 - grace) for s in losers)
    ceiling = total / (total - saved) if total > saved else float("inf")
    return {"losers": len(losers), "saved_s": saved, "ceiling": ceiling}


def _gpu_seconds(events: list[dict[str, Any]]) -> float:
    """The GPU seconds of every recorded run (``finished`` events' ``seconds``)."""
    return sum(
        float(e["seconds"])
        for e in events
        if e["ev"] == "finished" and isinstance(e.get("seconds"), int | float)
    )


def run(cfg: Config) -> list[Row]:
    n, budget = _sizes(cfg)
    size = f"demo, {n} experiments on sim:{SLOTS}, {budget:g} s budget, seed {SEED}"
    got: dict[str, dict[str, Any]] = {}
    rows: list[Row] = []
    for rule in ("off", "median"):
        say(f"research pruning: --prune {rule}, {n} experiments")
        try:
            got[rule] = arm(cfg, rule)
        except Exception as exc:
            rows.append(failed(BENCH, f"{size}: experiments/hour", f"--prune {rule}", exc))
    for rule, r in got.items():
        row = Row(BENCH, f"{size}: experiments/hour", f"gpuswarm --prune {rule}", r["per_hour"])
        row.unit = "/h"
        row.note = (
            f"{r['experiments']} experiments ({r['runs']} runs with baselines and controls) in "
            f"{r['wall']:.0f} s; best val_bpb {r['best']}; {r['kept']} kept; {r['pruned']} "
            f"pruned, GPU time saved {r['gpu_saved_s']:.0f} s"
        )
        for key, k in (("replay", 3), ("replay_k2", 2)):
            replay = r.get(key)
            if replay:
                share = replay["gpu_saved_s"] / max(r["gpu_s"], 1e-9)
                row.note += (
                    f"; its ledger replayed with --prune median --prune-k {k}: would stop "
                    f"{len(replay['would_prune'])}, saving {replay['gpu_saved_s']:.0f} s "
                    f"({share:.0%} of its {r['gpu_s']:.0f} GPU s), best "
                    + ("changed" if replay["best_changed"] else "unchanged")
                )
        if rule == "off":
            o = r["oracle"]
            share = o["saved_s"] / max(r["gpu_s"], 1e-9)
            row.note += (
                f"; an oracle stopping all {o['losers']} variants that ended discard at 20% of "
                f"their run would save {o['saved_s']:.0f} s ({share:.0%}): at most "
                f"{o['ceiling']:.2f}x"
            )
        row.extra = {k: v for k, v in r.items()}
        rows.append(row)
    if "off" in got and "median" in got:
        gain = got["median"]["per_hour"] / got["off"]["per_hour"]
        b_off, b_med = got["off"]["best"], got["median"]["best"]
        no_worse = b_off is not None and b_med is not None and b_med <= b_off
        for row in rows:
            if row.tool == "gpuswarm --prune median":
                row.target = ">= 1.3x off, best no worse"
                row.ok = gain >= 1.3 and no_worse
                row.ratio = f"{gain:.2f}x"
                row.note += f"; best {b_med} vs {b_off} without pruning"
    return rows
