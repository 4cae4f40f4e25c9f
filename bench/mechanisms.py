"""1b. Cost per task of each mechanism: CPU µs per task of gpuswarm's threads, each switched off.

The throughput run (N x ``true`` on sim:8, durable) is made in a child process
(``mechanism_child.py``) once with everything on and once with each mechanism switched off by a
benchmark-build monkeypatch (``mechanism_switches.py``: nothing in gpuswarm turns any of them
off). A mechanism's cost is the CPU of gpuswarm's own threads (main, slot loop, committer, log
pump, keeper, heartbeat, waiters; the children and the log keeper process left out) with it on
minus with it off, per task. The runs go in rounds (3), each round every case once in a shuffled
order and the reference twice; each case counts its least CPU over the rounds (a loaded machine
only ever adds CPU time), and a cost is the reference's least minus the case's least. A cost
within the spread of the reference is noise: the table gives that spread beside it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from common import BENCH_DIR, Config, Row, env_for_bench, say
from mechanism_switches import SWITCHES

BENCH = "1b mechanisms"
BEGIN = "<!-- bench:mechanisms:begin (written by bench/run.py; do not edit by hand) -->"
END = "<!-- bench:mechanisms:end -->"
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
    rounds = 3
    work = cfg.work / "mechanisms"
    work.mkdir(parents=True, exist_ok=True)
    cmds = work / "cmds.txt"
    cmds.write_text("true\n" * n)
    names = list(SWITCHES)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
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
    base = runs["none"]
    own = {name: [_own(d) / n * 1e6 for d in data] for name, data in runs.items()}
    ref = min(own["none"])  # the machine's load only ever adds CPU time: the least is nearest
    spread = max(own["none"]) - ref
    split = ", ".join(f"{k} {min(d.get(k, 0.0) for d in base) / n * 1e6:.0f}" for k in THREADS[:3])
    metric = f"{n} x `true` on sim:8: CPU µs per task of gpuswarm's threads"
    rows = [
        Row(
            BENCH,
            metric,
            "everything on",
            ref,
            "µs",
            note=f"the reference: the least of {len(base)} runs (the others up to {spread:.0f} µs "
            f"more); {split}",
            extra={"runs": own["none"]},
        )
    ]
    for name in names[1:]:
        least = min(runs[name], key=_own)
        by_thread = {
            k: (min(d.get(k, 0.0) for d in base) - least.get(k, 0.0)) / n * 1e6
            for k in ("loop", "committer")
        }
        rows.append(
            Row(
                BENCH,
                f"cost per task: {SWITCHES[name].what}",
                f"off: {name}",
                ref - min(own[name]),
                "µs",
                note=f"loop {by_thread['loop']:.0f}, committer {by_thread['committer']:.0f}; "
                f"runs {', '.join(f'{v:.0f}' for v in own[name])}",
                extra={"runs": own[name], "by_thread": by_thread},
            )
        )
    return rows
