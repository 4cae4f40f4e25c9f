"""1b. Cost per task of each mechanism: CPU µs per task of gpuswarm's threads, each switched off.

The throughput run (N x ``true`` on sim:8, durable) is made in a child process
(``mechanism_child.py``) once with everything on and once with each mechanism switched off by a
benchmark-build monkeypatch (``mechanism_switches.py``: nothing in gpuswarm turns any of them
off). A mechanism's cost is the CPU of gpuswarm's own threads (main, slot loop, committer, log
pump, keeper, heartbeat, waiters; the children and the log keeper process left out) with it on
minus with it off, per task. The runs go in rounds, each round every case once in a shuffled
order, and the cost is the median over the rounds of the difference within a round: the machine's
load drifts less within a round than across the benchmark. A cost within the spread of the
reference is noise: the table gives that spread beside it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from common import BENCH_DIR, Config, Row, env_for_bench, median, say
from mechanism_switches import SWITCHES

BENCH = "1b mechanisms"
THREADS = ("main during", "loop", "committer", "pump", "keeper", "heartbeat", "other threads")


def _once(switch: str, cmds: Path, work: Path) -> dict[str, float]:
    ws = Path(tempfile.mkdtemp(prefix=f"{switch}-", dir=work))
    out = ws / "cpu.json"
    child = BENCH_DIR / "mechanism_child.py"
    subprocess.run(
        [sys.executable, str(child), switch, str(cmds), str(ws / "runs"), str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env_for_bench(),
        timeout=900,
    )
    data: dict[str, float] = json.loads(out.read_text())
    if data.get("exit") != 0:
        raise RuntimeError(f"{switch}: gpuswarm exited {data.get('exit')}")
    return data


def _own(data: dict[str, float]) -> float:
    """CPU seconds of gpuswarm's threads during the run (start-up and outputs left out)."""
    return sum(data.get(k, 0.0) for k in THREADS)


def run(cfg: Config) -> list[Row]:
    n = cfg.throughput_tasks
    rounds = 2 if cfg.quick else 3
    work = cfg.work / "mechanisms"
    work.mkdir(parents=True, exist_ok=True)
    cmds = work / "cmds.txt"
    cmds.write_text("true\n" * n)
    names = list(SWITCHES)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    refs: list[float] = []  # per round: the mean of its two reference runs
    for r in range(rounds):
        order = names[1:]
        random.shuffle(order)
        order.insert(len(order) // 2, "none")  # a reference at the start and in the middle
        say(f"mechanisms: round {r + 1} of {rounds} ({len(order) + 1} runs of {n} tasks)")
        pair = [_once("none", cmds, work)]
        for name in order:
            data = _once(name, cmds, work)
            if name == "none":
                pair.append(data)
            else:
                runs[name].append(data)
        runs["none"].extend(pair)
        refs.append(sum(_own(d) for d in pair) / len(pair))
    base = runs["none"]
    ref = median(refs) / n * 1e6
    spread = (max(_own(d) for d in base) - min(_own(d) for d in base)) / n * 1e6
    split = ", ".join(
        f"{k} {median([d.get(k, 0.0) for d in base]) / n * 1e6:.0f}" for k in THREADS[:3]
    )
    metric = f"{n} x `true` on sim:8: CPU µs per task of gpuswarm's threads"
    rows = [
        Row(
            BENCH,
            metric,
            "everything on",
            ref,
            "µs",
            note=f"the reference; {2 * rounds} runs, spread {spread:.0f} µs; " + split,
            extra={"rounds": [_own(d) / n * 1e6 for d in base]},
        )
    ]
    for name in names[1:]:
        diffs = [(b - _own(s)) / n * 1e6 for b, s in zip(refs, runs[name], strict=True)]
        by_thread = {
            k: median(
                [b.get(k, 0.0) - s.get(k, 0.0) for b, s in zip(base[::2], runs[name], strict=True)]
            )
            / n
            * 1e6
            for k in ("loop", "committer")
        }
        rows.append(
            Row(
                BENCH,
                f"cost per task: {SWITCHES[name].what}",
                f"off: {name}",
                median(diffs),
                "µs",
                note=f"loop {by_thread['loop']:.0f}, committer {by_thread['committer']:.0f}; "
                f"rounds {', '.join(f'{d:.0f}' for d in diffs)}",
                extra={"rounds": diffs, "by_thread": by_thread},
            )
        )
    return rows
