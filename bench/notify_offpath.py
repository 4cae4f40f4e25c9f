"""Webhooks off the hot path (issue 37): N no-op tasks on sim:4, three times each way:

- no ``notify:``;
- a receiver that hangs 30 s on every request (``timeout: 30s``);
- a URL that refuses connections (a closed port; ``retries: 5``).

Reported per way: the in-run dispatch rate (first ``started`` to last ``finished`` event),
the idle gap between a slot's attempts (median, p99; the journal folded as ``/metrics`` does:
``gpuswarm.metrics.runstats.JournalFold``) and the run's wall clock (which includes the
bounded ``end_wait``, 2 s here). The first two must not move with the receiver.

    PYTHONPATH=src python bench/notify_offpath.py [N]
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from gpuswarm.core.paths import find_runs
from gpuswarm.metrics.runstats import JournalFold


class _Hang(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        time.sleep(30)

    def log_message(self, format: str, *args: object) -> None:
        return


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one(base: Path, n: int, notify: dict[str, Any] | None) -> dict[str, float]:
    config: dict[str, Any] = {"name": "b", "gpus": "sim:4"}
    config["tasks"] = [{"name": f"t{i}", "command": "true", "shell": True} for i in range(n)]
    config["tasks"] += [{"name": f"f{i}", "command": "exit 1", "shell": True} for i in range(20)]
    if notify is not None:
        config["notify"] = {**notify, "end_wait": "2s", "failed_first": 20}
    (base / "c.yaml").write_text(yaml.safe_dump(config))
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "gpuswarm", "run", "c.yaml", "-q", "--no-report"],
        cwd=base,
        check=False,
        capture_output=True,
    )
    wall = time.monotonic() - t0
    (run,) = find_runs(base / "runs")
    fold = JournalFold(run / "events.jsonl")
    fold.poll()
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    starts = [e["ts"] for e in events if e["ev"] == "started"]
    ends = [e["ts"] for e in events if e["ev"] == "finished"]
    gaps = _gaps(events)
    return {
        "rate": len(ends) / max(1e-9, max(ends) - min(starts)),
        "gap_p50_ms": 1000 * gaps[len(gaps) // 2],
        "gap_p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))],
        "wall_s": wall,
        "idle_count": fold.idle.n,
    }


def _gaps(events: list[dict[str, Any]]) -> list[float]:
    fold = JournalFold(Path("/nonexistent"))
    out: list[float] = []
    observe = fold.idle.observe

    def record(value: float) -> None:
        out.append(value)
        observe(value)

    fold.idle.observe = record  # type: ignore[method-assign]
    from gpuswarm.core.events import decode

    for raw in events:
        e = decode(raw)
        if e is not None:
            fold.apply(e)
    return sorted(out) or [0.0]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    hang = ThreadingHTTPServer(("127.0.0.1", 0), _Hang)  # every request hangs 30 s
    hang.daemon_threads = True
    threading.Thread(target=hang.serve_forever, daemon=True).start()
    ways: dict[str, dict[str, Any] | None] = {
        "none": None,
        "hanging": {"url": f"http://127.0.0.1:{hang.server_address[1]}/", "timeout": "30s"},
        "refused": {"url": f"http://127.0.0.1:{_closed_port()}/", "retries": 5},
    }
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    for _ in range(3):  # the ways interleaved: a loaded machine's drift hits each alike
        for name, notify in ways.items():
            with tempfile.TemporaryDirectory() as tmp:
                rows[name].append(_one(Path(tmp), n, notify))
    for name, got in rows.items():
        med = {k: sorted(r[k] for r in got)[1] for k in got[0]}
        print(
            f"{name:8s} rate {med['rate']:7.1f} tasks/s  idle gap p50 {med['gap_p50_ms']:6.2f} ms"
            f"  p99 {med['gap_p99_ms']:7.2f} ms  wall {med['wall_s']:5.1f} s"
        )
    hang.shutdown()
    hang.server_close()


if __name__ == "__main__":
    main()
