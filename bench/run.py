"""gpuswarm's performance benchmarks, each beside its peers, in one run.

    bash bench/setup.sh && python bench/run.py          # full run (about 10 minutes on 2 cores)
    python bench/run.py --quick                         # smoke run (about 2 minutes)
    python bench/run.py --only throughput,idle_gap      # some of them
    python bench/run.py --update-doc                    # also rewrite BENCHMARKS.md's tables

Benchmarks: throughput, mechanisms, scale, idle_gap, cpu, research, docker, control, gpumem,
dashboard, validation, prune (see each module's docstring for what is measured and how). Prints one
table and writes ``<out>/latest.json`` and ``<out>/latest.md`` (the markdown BENCHMARKS.md
embeds: the queue-control rows in their own section, "Queue control", the dashboard's in
"Dashboard", the mechanisms' in "Cost per task of each mechanism", the others in "Results"; a
run updates only the sections of what it ran). Peers that are not installed are reported as
skipped, and so is docker where no engine answers.
No timing here is a test: nothing fails the command but a crash of the harness itself.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import control
import cpu
import dashboard
import docker_overhead
import gpu_memory
import latency
import mechanisms
import prune
import ray_dispatch
import report
import research_util
import scale
import throughput
import validation
from common import REPO, Config, Row, failed, say
from machine import describe

BENCHES: dict[str, Callable[[Config], list[Row]]] = {
    "throughput": throughput.run,
    "mechanisms": mechanisms.run,  # issue 31: CPU per task of each mechanism, switched off
    "scale": scale.run,
    "idle_gap": latency.run,
    "cpu": cpu.run,
    "research": research_util.run,
    "docker": docker_overhead.run,
    "control": control.run,
    "ray": ray_dispatch.run,
    "gpumem": gpu_memory.run,  # issue 19: GPU memory packing vs one task per GPU
    "dashboard": dashboard.run,
    "validation": validation.run,  # issue 30: configs with thousands of problems
    "prune": prune.run,  # issue 38: research loop --prune median vs off, experiments/hour
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a 1-2 minute smoke run")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHES)}")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--tmp", type=Path, help="scratch folder parent (default: system temp)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument(
        "--update-doc", action="store_true", help="replace the results table in BENCHMARKS.md"
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in (args.only or ",".join(BENCHES)).split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; pick from {', '.join(BENCHES)}")
    args.names = names
    return args


def _compile_gpuswarm() -> None:
    """Byte-compile the package as ``pip install`` does, so every CLI start is measured with
    cached bytecode (an editable install under PYTHONDONTWRITEBYTECODE would recompile each
    changed module at every start and charge it to the benchmark)."""
    import compileall

    import gpuswarm

    compileall.compile_dir(Path(gpuswarm.__file__).parent, quiet=1)


def _update_doc(rows: list[Row], machine: dict[str, str], info: dict[str, Any], md: Path) -> None:
    """Write the results into BENCHMARKS.md: the queue-control rows into their section, the
    others into "Results"; a section whose benchmarks did not run is left as it is."""
    doc = REPO / "BENCHMARKS.md"
    ours = [r for r in rows if r.bench == control.BENCH]
    dash = [r for r in rows if r.bench == dashboard.BENCH]  # its own section too
    mech = [r for r in rows if r.bench == mechanisms.BENCH]  # and the mechanisms' table
    apart = (control.BENCH, dashboard.BENCH, mechanisms.BENCH)
    others = [r for r in rows if r.bench not in apart]
    parts = [(others, report.BEGIN, report.END), (ours, report.CONTROL_BEGIN, report.CONTROL_END)]
    parts.append((dash, dashboard.BEGIN, dashboard.END))
    parts.append((mech, mechanisms.BEGIN, mechanisms.END))
    for part, begin, end in parts:
        if not part:
            continue
        if report.update_doc(doc, report.markdown(part, machine, info), begin, end):
            print(f"updated {doc} ({len(part)} rows)")
        else:
            print(f"{doc}: no results markers {begin!r} found; paste {md} by hand", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    command = "python bench/run.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    work = Path(tempfile.mkdtemp(prefix="gpuswarm-bench-", dir=args.tmp))
    _compile_gpuswarm()
    cfg = Config.make(args.quick, work)
    machine = describe(work)
    say(f"scratch folder {work}; load average {machine['load average at start (1, 5, 15 min)']}")
    started = time.time()
    rows: list[Row] = []
    info: dict[str, Any] = {"command": command.strip(), "quick": args.quick}
    md_path = args.out / "latest.md"
    try:
        for name in args.names:
            t0 = time.perf_counter()
            try:
                rows += BENCHES[name](cfg)
            except Exception as exc:  # a harness bug in one benchmark must not lose the others
                rows.append(failed(name, "the whole benchmark", "harness", exc))
            say(f"{name}: {time.perf_counter() - t0:.0f} s")
            info.update(
                date=time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(started)),
                minutes=(time.time() - started) / 60,
                load_at_end=", ".join(f"{x:.2f}" for x in os.getloadavg()),
            )
            md_path = report.write(args.out, rows, machine, info)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report.print_table(rows)
    print(f"wrote {md_path} and {md_path.with_suffix('.json')}")
    if args.update_doc:
        _update_doc(rows, machine, info, md_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
