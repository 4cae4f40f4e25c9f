"""6. Docker backend: what a container per attempt costs, beside a bare ``docker run``.

Measured in one run, on one image built offline (no registry: an empty rootfs with a real
``sbin/`` for ``--init``, run with the host's ``/usr`` bind-mounted read-only, as the tests do):

(a) the floor: ``docker run --rm --network none -v /usr:/usr:ro IMG true``, N times one after
    the other (after one unmeasured warm-up call), per call mean and median;
(b) gpuswarm with ``backend: docker`` running N tasks ``true`` on one slot (``--gpus sim:1``):
    per-attempt overhead = wall of the whole ``gpuswarm run`` command / N (interpreter start,
    run creation, the engine and image checks and the outputs included). Target: at most 1.3x
    (a)'s mean. The in-run figure (first ``started`` to last ``finished`` event of the journal,
    / N) is in the notes; the same N tasks with the local backend are a row of their own;
(c) the idle gap on the slot, docker beside local, each over N tasks on ``sim:1``:
    - gpuswarm's own turnaround, from the attempt records of every descriptor (as
      ``bench/latency.py`` does): an attempt's ``ended`` to the next one's ``started``, from
      the run of (b) (docker) and of its local twin;
    - what the GPU sees, task-stamped (``bench/latency.py``'s wrapper: ``bash -c 'echo
      $EPOCHREALTIME >> s...; sleep 0.05; echo $EPOCHREALTIME >> e...'``): the next task's
      first stamp minus the previous task's last one. With docker it includes the container's
      teardown and the next one's start; the stamp folder is a bind mount.

Skipped, with a note, when there is no docker CLI or no engine answers. The image is tagged
``gpuswarm-bench:base`` and removed at the end; containers are all ``--rm`` or gpuswarm's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    GPUSWARM,
    Config,
    Row,
    env_for_bench,
    failed,
    median,
    percentile,
    read_events,
    say,
    skipped,
    the_run,
    timed,
)
from latency import attempt_gaps, stamp_gaps, wrapper_line

BENCH = "6 docker backend"
IMAGE = "gpuswarm-bench:base"
NO_ENGINE = "skipped (no docker engine"


def engine_problem() -> str | None:
    """Why docker cannot be benchmarked here, or None when the CLI and an engine answer."""
    if shutil.which("docker") is None:
        return "docker CLI not installed"
    try:
        out = subprocess.run(
            ["docker", "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker version: {type(exc).__name__}"
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return lines[-1][:120] if lines else f"docker version exited {out.returncode}"
    return None


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def build_image(work: Path, tag: str = IMAGE) -> float:
    """``docker import`` of an empty rootfs (the test image's recipe); seconds it took."""
    root = work / "rootfs"
    shutil.rmtree(root, ignore_errors=True)
    for name in ("usr", "etc", "tmp", "proc", "sys", "dev", "sbin"):
        (root / name).mkdir(parents=True)
    (root / "tmp").chmod(0o1777)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / link).symlink_to(target)
    tar = work / "rootfs.tar"
    with tarfile.open(tar, "w") as fh:
        for entry in sorted(root.iterdir()):
            fh.add(entry, arcname=entry.name, filter=_root_owned)
    start = time.perf_counter()
    with tar.open("rb") as fh:
        subprocess.run(
            ["docker", "import", "-", tag], stdin=fh, capture_output=True, check=True, timeout=120
        )
    return time.perf_counter() - start


def remove_image(tag: str = IMAGE) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["docker", "rmi", tag], capture_output=True, timeout=60, check=False)


def bare_calls(n: int, tag: str = IMAGE) -> list[float]:
    """Wall seconds of each of ``n`` bare ``docker run --rm`` calls of ``true`` (one warm-up)."""
    argv = ["docker", "run", "--rm", "--network", "none", "-v", "/usr:/usr:ro", tag, "true"]
    timed(argv)
    return [timed(argv) for _ in range(n)]


def config_text(n: int, command: list[str], *, backend: str, mounts: list[Path]) -> str:
    """A run config: ``n`` copies of ``command`` on ``sim:1`` (JSON is YAML)."""
    config: dict[str, object] = {
        "name": f"bench-{backend}",
        "gpus": "sim:1",
        "backend": backend,
        "tasks": [{"matrix": {"i": list(map(str, range(n)))}, "name": "t{i}", "command": command}],
    }
    if backend == "docker":
        config["docker"] = {
            "image": IMAGE,
            "network": "none",
            "mounts": [
                {"src": "/usr", "dest": "/usr", "read_only": True},
                *({"src": str(m), "dest": str(m)} for m in mounts),
            ],
        }
    return json.dumps(config, indent=2) + "\n"


@dataclass(frozen=True)
class Run:
    """One finished ``gpuswarm run``: its wall seconds and run folder."""

    wall: float
    run_dir: Path

    def in_run(self) -> float:
        """First ``started`` to last ``finished`` event, seconds."""
        starts, ends = [], []
        for ev in read_events(self.run_dir / "events.jsonl"):
            if ev.get("ev") == "started":
                starts.append(float(ev["ts"]))
            elif ev.get("ev") == "finished":
                ends.append(float(ev["ts"]))
        return max(ends) - min(starts)


def gpuswarm_run(folder: Path, n: int, command: list[str], backend: str, mounts: list[Path]) -> Run:
    """One ``gpuswarm run`` of ``n`` tasks on sim:1 in ``folder``: its wall and run folder."""
    folder.mkdir(parents=True)
    cfg = folder / "bench.yaml"
    cfg.write_text(config_text(n, command, backend=backend, mounts=mounts))
    argv = [*GPUSWARM, "run", "-q", "--no-report", "--workspace", str(folder / "ws"), str(cfg)]
    start = time.perf_counter()
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=folder,
        env=env_for_bench(LC_ALL="C"),
        timeout=600,
        check=False,
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-2:]
        raise RuntimeError(f"gpuswarm run ({backend}) exited {proc.returncode}: {' | '.join(tail)}")
    run_dir = the_run(folder / "ws")
    if run_dir is None:
        raise RuntimeError(f"no run folder under {folder / 'ws'}")
    done = json.loads((run_dir / "summary.json").read_text())["counts"]["done"]
    if done != n:
        raise RuntimeError(f"gpuswarm ({backend}) finished {done} of {n} tasks")
    return Run(wall, run_dir)


def _ms(values: list[float]) -> tuple[float, float]:
    return median(values) * 1e3, percentile(values, 99) * 1e3


def _gap_row(metric: str, tool: str, gaps: list[float], peer: float | None) -> Row:
    med, p99 = _ms(gaps)
    ratio = f"docker {med / peer:.1f}x" if peer else ""
    return Row(
        BENCH,
        metric,
        tool,
        med,
        "ms",
        ratio=ratio,
        shown=f"{med:.1f} / {p99:.1f}",
        extra={"median_ms": med, "p99_ms": p99, "gaps": len(gaps)},
    )


def run(cfg: Config) -> list[Row]:
    n = cfg.docker_tasks
    bare_metric = (
        f"{n} x `docker run --rm --network none IMG true`, one after the other: "
        "per call, mean / median ms"
    )
    ours_metric = f"{n} x `true` on sim:1: wall / {n} (per attempt), ms"
    gap_metric = f"{n} x `true` on sim:1: attempt end -> next attempt start (attempt records)"
    stamp_metric = f"{n} x sleep {cfg.gap_sleep:g} on sim:1: exit -> next start, task-stamped"
    why = engine_problem()
    if why is not None:
        note = f"{NO_ENGINE}: {why})"
        return [
            skipped(BENCH, bare_metric, "docker CLI", note),
            skipped(BENCH, ours_metric, "gpuswarm docker", note),
            skipped(BENCH, f"{gap_metric}, median / p99 ms", "gpuswarm docker", note),
            skipped(BENCH, f"{stamp_metric}, median / p99 ms", "gpuswarm docker", note),
        ]
    work = cfg.work / "docker"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows: list[Row] = []
    try:
        built = build_image(work)
        say(f"docker: image {IMAGE} built in {built:.2f} s; {n} bare docker runs")
        bare: list[float] | None = None
        try:
            bare = bare_calls(n)
            mean, med = statistics.fmean(bare) * 1e3, median(bare) * 1e3
            rows.append(
                Row(
                    BENCH,
                    bare_metric,
                    "docker CLI (the floor)",
                    mean,
                    "ms",
                    shown=f"{mean:.0f} / {med:.0f}",
                    note=f"p99 {percentile(bare, 99) * 1e3:.0f} ms; image import {built:.2f} s",
                    extra={"mean_ms": mean, "median_ms": med, "calls": n},
                )
            )
        except Exception as exc:
            rows.append(failed(BENCH, bare_metric, "docker CLI (the floor)", exc))
        rows += _runs(cfg, work, n, bare, ours_metric, gap_metric, stamp_metric)
    finally:
        remove_image()
    return rows


def _runs(
    cfg: Config,
    work: Path,
    n: int,
    bare: list[float] | None,
    ours_metric: str,
    gap_metric: str,
    stamp_metric: str,
) -> list[Row]:
    rows: list[Row] = []
    runs: dict[str, Run] = {}
    for backend in ("docker", "local"):
        tool = f"gpuswarm {backend}"
        say(f"docker: {n} x true, backend {backend}")
        try:
            runs[backend] = gpuswarm_run(work / f"true-{backend}", n, ["true"], backend, [])
        except Exception as exc:
            rows.append(failed(BENCH, ours_metric, tool, exc))
            continue
        r = runs[backend]
        per = r.wall / n * 1e3
        note = f"in-run {r.in_run() / n * 1e3:.0f} ms per attempt; wall {r.wall:.1f} s"
        if backend == "docker" and bare:
            floor = statistics.fmean(bare) * 1e3
            ratio = per / floor
            rows.append(
                Row(
                    BENCH,
                    ours_metric,
                    tool,
                    per,
                    "ms",
                    "<= 1.3x bare docker run",
                    ratio <= 1.3,
                    ratio=f"{ratio:.2f}x the floor",
                    note=note,
                    extra={"per_attempt_ms": per, "ratio": ratio, "wall_s": r.wall},
                )
            )
        else:
            rows.append(Row(BENCH, ours_metric, tool, per, "ms", note=note))
    gaps = {b: attempt_gaps(r.run_dir) for b, r in runs.items()}
    local_gap = median(gaps["local"]) * 1e3 if gaps.get("local") else None
    for backend in ("docker", "local"):
        if gaps.get(backend):
            peer = local_gap if backend == "docker" else None
            metric = f"{gap_metric}, median / p99 ms"
            rows.append(_gap_row(metric, f"gpuswarm {backend}", gaps[backend], peer))
    stamped: dict[str, list[float]] = {}
    for backend in ("local", "docker"):
        tool = f"gpuswarm {backend}"
        say(f"docker: {n} x stamped sleep, backend {backend}")
        stamps = work / f"stamps-{backend}"
        stamps.mkdir()
        line = wrapper_line(stamps, cfg.gap_sleep)
        command = ["bash", "-c", line.removeprefix("bash -c '").removesuffix("'")]
        try:
            gpuswarm_run(work / f"gap-{backend}", n, command, backend, [stamps])
            stamped[backend] = stamp_gaps(stamps)
        except Exception as exc:
            rows.append(failed(BENCH, f"{stamp_metric}, median / p99 ms", tool, exc))
    peer = median(stamped["local"]) * 1e3 if "local" in stamped else None
    for backend in ("docker", "local"):
        if backend in stamped:
            rows.append(
                _gap_row(
                    f"{stamp_metric}, median / p99 ms",
                    f"gpuswarm {backend}",
                    stamped[backend],
                    peer if backend == "docker" else None,
                )
            )
    return rows


if __name__ == "__main__":  # python bench/docker_overhead.py: this benchmark alone, no report
    import tempfile

    from report import print_table

    with tempfile.TemporaryDirectory(prefix="gpuswarm-bench-docker-") as tmp:
        print_table(run(Config.make(bool(os.environ.get("QUICK")), Path(tmp))))
