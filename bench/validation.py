"""Config validation with many problems (issue 30): a config that is wrong in thousands of places
is rejected in well under a second, its first problems named.

Three inputs, each written to the scratch folder and given to the real loader
(``gpuswarm.config.load.load_config``, in this process: what ``gpuswarm run`` does before
anything else), best of ``repeats``:

- 20,000 unknown top-level keys (``bogus_key_<i>: 1``);
- 1,000 tasks with 50 unknown keys each (50,000 problems);
- 20,000 tasks with a timeout that is no duration (``timeout: bad<i>``).

Each must end in a ConfigError (exit 2) naming the first problem with its line; the target is
< 1 s each. The row shows the wall clock and its note the CPU seconds; the target is judged on
the CPU seconds, which on an idle machine are the wall clock and on a shared one are not slowed
by the other processes.
Run alone: ``python bench/validation.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from common import Config, Row, failed

from gpuswarm.config.load import load_config
from gpuswarm.core.errors import ConfigError

BENCH = "9 config validation"
TARGET_S = 1.0


def unknown_keys(n: int = 20_000) -> str:
    return "tasks: [{command: 'true'}]\n" + "".join(f"bogus_key_{i}: 1\n" for i in range(n))


def task_keys(tasks: int = 1_000, keys: int = 50) -> str:
    entry = "  - command: 'true'\n" + "".join(f"    xk{j}: 1\n" for j in range(keys))
    return "tasks:\n" + entry * tasks


def bad_timeouts(n: int = 20_000) -> str:
    return "tasks:\n" + "".join(f"  - {{command: 'true', timeout: bad{i}}}\n" for i in range(n))


CASES: list[tuple[str, Callable[[], str], str]] = [
    ("20,000 unknown top-level keys", unknown_keys, ":2: unknown key 'bogus_key_0'"),
    ("1,000 tasks x 50 unknown keys", task_keys, ":3: unknown key 'xk0' in tasks[0]"),
    ("20,000 tasks with a bad timeout", bad_timeouts, ":2: tasks[0].timeout: 'bad0'"),
]


def measure(path: Path, repeats: int) -> tuple[float, float, str]:
    """(best wall seconds, its CPU seconds, the message) of rejecting ``path``."""
    best = (float("inf"), 0.0, "")
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            load_config(path)
        except ConfigError as exc:
            message = str(exc)
        else:
            message = "(loaded: no ConfigError)"
        took = (time.perf_counter() - wall, time.process_time() - cpu, message)
        best = min(best, took)
    return best


def run(cfg: Config) -> list[Row]:
    rows: list[Row] = []
    folder = cfg.work / "validation"
    folder.mkdir(parents=True, exist_ok=True)
    for n, (metric, make, expected) in enumerate(CASES):
        try:
            path = folder / f"case{n}.yaml"
            path.write_text(make())
            wall, cpu, message = measure(path, max(1, cfg.repeats))
            named = expected in message.splitlines()[0] and "more problems" in message
            size = f"{path.stat().st_size / 1024:.0f} KB"
            note = f"{size}; CPU {cpu:.2f} s" + ("" if named else f"; WRONG MESSAGE: {message}")
            rows.append(
                Row(BENCH, f"reject {metric}", "gpuswarm", wall, "s", "< 1 s (CPU)",
                    cpu < TARGET_S and named, note=note)
            )  # fmt: skip
        except Exception as exc:  # a harness bug in one case must not lose the others
            rows.append(failed(BENCH, metric, "gpuswarm", exc))
    return rows


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpuswarm-bench-") as tmp:
        for row in run(Config.make(quick="--quick" in sys.argv, work=Path(tmp))):
            print(f"{row.metric:45} {row.value or 0:6.2f} s  {row.status():8} {row.note}")
