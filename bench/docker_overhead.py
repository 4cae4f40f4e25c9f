"""6. Docker backend: what a container per attempt costs, beside a bare ``docker run``.

Measured in one run, on one image built offline (no registry: an empty rootfs with a real
``sbin/`` for ``--init``, run with the host's ``/usr`` bind-mounted read-only, as the tests do):

(a) the floor: ``docker run --rm --network none -v /usr:/usr:ro IMG true``, N times one after
    the other (after one unmeasured warm-up call), per call mean and median. Beside it, in the
    same rounds (one bare call, then one attempt's calls by hand, N times), the three docker
    calls the backend makes per attempt, each timed: ``docker run`` attached with the
    backend's flags (``--init --log-driver none --pull never --user``, a ``--mount``, a label;
    no ``--rm``), ``docker container inspect`` of the ended container, ``docker rm --force``.
    Half of the rounds run before (b)'s docker run and half after it, so that the floor and
    gpuswarm see the same load on a shared machine;
(b) gpuswarm with ``backend: docker`` running N tasks ``true`` on one slot (``--gpus sim:1``):
    per-attempt overhead = wall of the whole ``gpuswarm run`` command / N (interpreter start,
    run creation, the engine and image checks and the outputs included). Target: at most 1.3x
    (a)'s mean. The in-run figure (first ``started`` to last ``finished`` event of the journal,
    / N) is in the notes; the same N tasks with the local backend are a row of their own;
(c) the idle gap on the slot, docker beside local, each over N tasks on ``sim:1``:
    - gpuswarm's own turnaround, from the attempt records of every descriptor (as
      ``bench/latency.py`` does): an attempt's ``ended`` to the next one's ``started``, from
      the runs of (b);
    - what the GPU sees, task-stamped (``bench/latency.py``'s wrapper: ``bash -c 'echo
      $EPOCHREALTIME >> s...; sleep 0.05; echo $EPOCHREALTIME >> e...'``): the next task's
      first stamp minus the previous task's last one. With docker it includes the container's
      teardown and the next one's start; the stamp folder is a bind mount (``docker.mounts``).

Skipped, with a note, when there is no docker CLI or no engine answers. The image is tagged
``gpuswarm-bench:base`` and removed at the end, with any container labelled
``gpuswarmbench=1`` (the by-hand calls') that an interruption left.

    python bench/run.py --only docker          # this benchmark, in the report
    python bench/docker_overhead.py            # alone, printed (QUICK=1: 15 tasks)
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
from dataclasses import dataclass, field
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


BARE = ["docker", "run", "--rm", "--network", "none", "-v", "/usr:/usr:ro", IMAGE, "true"]


@dataclass
class Floors:
    """Seconds of each bare ``docker run --rm`` (``bare``) and of each of the backend's three
    docker calls made by hand (``calls``: run, inspect, rm)."""

    bare: list[float] = field(default_factory=list)
    calls: dict[str, list[float]] = field(
        default_factory=lambda: {"run": [], "inspect": [], "rm": []}
    )

    def measure(self, n: int) -> None:
        """``n`` rounds, each one bare call and one attempt's calls by hand (interleaved, so
        both see the same load on a shared machine)."""
        base = f"gpuswarmbench-{os.getpid()}-{len(self.bare)}"
        flags = ["--init", "--log-driver", "none", "--pull", "never", "--network", "none"]
        flags += ["--user", f"{os.getuid()}:{os.getgid()}", "--label", "gpuswarmbench=1"]
        flags += ["--mount", "type=bind,source=/usr,destination=/usr,readonly"]
        try:
            for i in range(n):
                self.bare.append(timed(BARE))
                name = f"{base}-{i}"
                self.calls["run"].append(
                    timed(["docker", "run", "--name", name, *flags, IMAGE, "true"])
                )
                inspect = ["docker", "container", "inspect", "--format", "{{json .State}}", name]
                self.calls["inspect"].append(timed(inspect))
                self.calls["rm"].append(timed(["docker", "rm", "--force", name]))
        finally:
            _remove_labelled("gpuswarmbench=1")


def _remove_labelled(label: str) -> None:
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout.split()
    if listed:
        subprocess.run(["docker", "rm", "--force", *listed], capture_output=True, check=False)


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
    ratio = f"docker {med / peer:.1f}x local" if peer else ""
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
    m = Metrics(n, cfg.gap_sleep)
    why = engine_problem()
    if why is not None:
        note = f"{NO_ENGINE}: {why})"
        return [
            skipped(BENCH, m.bare, "docker CLI (the floor)", note),
            skipped(BENCH, m.ours, "gpuswarm docker", note),
            skipped(BENCH, m.gap, "gpuswarm docker", note),
            skipped(BENCH, m.stamped, "gpuswarm docker", note),
        ]
    work = cfg.work / "docker"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        built = build_image(work)
        say(f"docker: image {IMAGE} built in {built:.2f} s; the floors, then the runs")
        timed(BARE)  # warm-up: the first container of a fresh image pays for its layer set-up
        return _measure(cfg, work, m, built)
    finally:
        _remove_labelled("gpuswarmbench=1")
        remove_image()


@dataclass(frozen=True)
class Metrics:
    """The rows' measure texts."""

    n: int
    sleep: float

    @property
    def bare(self) -> str:
        return (
            f"{self.n} x `docker run --rm --network none IMG true`, one after the other: "
            "per call, mean / median ms"
        )

    @property
    def by_hand(self) -> str:
        return (
            f"{self.n} x the backend's docker calls by hand (`docker run --init --log-driver "
            "none ...` without --rm, `docker container inspect`, `docker rm --force`): "
            "per attempt, ms"
        )

    @property
    def ours(self) -> str:
        return f"{self.n} x `true` on sim:1: wall of `gpuswarm run` / {self.n}, per attempt ms"

    @property
    def gap(self) -> str:
        return (
            f"{self.n} x `true` on sim:1: attempt end -> next attempt start (attempt records), "
            "median / p99 ms"
        )

    @property
    def stamped(self) -> str:
        return (
            f"{self.n} x sleep {self.sleep:g} on sim:1: exit -> next start on the slot, "
            "task-stamped, median / p99 ms"
        )


def _measure(cfg: Config, work: Path, m: Metrics, built: float) -> list[Row]:
    n = m.n
    floors = Floors()
    rows: list[Row] = []
    runs: dict[str, Run] = {}
    errors: dict[str, Row] = {}
    floors.measure(n // 2)  # half of the floors before the docker run, half after: same load
    for backend in ("docker", "local"):
        say(f"docker: {n} x true, backend {backend}")
        try:
            runs[backend] = gpuswarm_run(work / f"true-{backend}", n, ["true"], backend, [])
        except Exception as exc:
            errors[backend] = failed(BENCH, m.ours, f"gpuswarm {backend}", exc)
        if backend == "docker":
            floors.measure(n - n // 2)
    floor = statistics.fmean(floors.bare) * 1e3
    rows.append(
        Row(
            BENCH,
            m.bare,
            "docker CLI (the floor)",
            floor,
            "ms",
            shown=f"{floor:.0f} / {median(floors.bare) * 1e3:.0f}",
            note=f"p99 {percentile(floors.bare, 99) * 1e3:.0f} ms; image import {built:.2f} s",
            extra={"mean_ms": floor, "median_ms": median(floors.bare) * 1e3, "calls": n},
        )
    )
    means = {k: statistics.fmean(v) * 1e3 for k, v in floors.calls.items()}
    total = sum(means.values())
    rows.append(
        Row(
            BENCH,
            m.by_hand,
            "docker CLI (3 calls)",
            total,
            "ms",
            ratio=f"{total / floor:.2f}x the floor",
            note="mean ms: " + ", ".join(f"{k} {v:.0f}" for k, v in means.items()),
            extra=means,
        )
    )
    for backend in ("docker", "local"):
        if backend in errors:
            rows.append(errors[backend])
            continue
        r = runs[backend]
        per = r.wall / n * 1e3
        note = f"in-run {r.in_run() / n * 1e3:.0f} ms per attempt; wall {r.wall:.1f} s"
        if backend == "docker":
            ratio = per / floor
            by_median = per / (median(floors.bare) * 1e3)
            note += f"; {by_median:.2f}x the floor's median"
            rows.append(
                Row(
                    BENCH,
                    m.ours,
                    "gpuswarm docker",
                    per,
                    "ms",
                    "<= 1.3x the floor",
                    ratio <= 1.3,
                    ratio=f"{ratio:.2f}x the floor",
                    note=note,
                    extra={"per_attempt_ms": per, "ratio": ratio, "wall_s": r.wall},
                )
            )
        else:
            rows.append(Row(BENCH, m.ours, "gpuswarm local", per, "ms", note=note))
    gaps = {b: attempt_gaps(r.run_dir) for b, r in runs.items()}
    rows += _gap_rows(m.gap, gaps)
    stamped: dict[str, list[float]] = {}
    for backend in ("local", "docker"):
        say(f"docker: {n} x stamped sleep, backend {backend}")
        stamps = work / f"stamps-{backend}"
        stamps.mkdir()
        line = wrapper_line(stamps, cfg.gap_sleep)
        command = ["bash", "-c", line.removeprefix("bash -c '").removesuffix("'")]
        try:
            gpuswarm_run(work / f"gap-{backend}", n, command, backend, [stamps])
            stamped[backend] = stamp_gaps(stamps)
        except Exception as exc:
            rows.append(failed(BENCH, m.stamped, f"gpuswarm {backend}", exc))
    rows += _gap_rows(m.stamped, stamped)
    return rows


def _gap_rows(metric: str, gaps: dict[str, list[float]]) -> list[Row]:
    """Docker's row (with its ratio to local's median) and local's, for those measured."""
    local = median(gaps["local"]) * 1e3 if gaps.get("local") else None
    rows = []
    for backend in ("docker", "local"):
        if gaps.get(backend):
            peer = local if backend == "docker" else None
            rows.append(_gap_row(metric, f"gpuswarm {backend}", gaps[backend], peer))
    return rows


if __name__ == "__main__":  # python bench/docker_overhead.py: this benchmark alone, no report
    import tempfile

    from report import print_table

    with tempfile.TemporaryDirectory(prefix="gpuswarm-bench-docker-") as tmp:
        print_table(run(Config.make(bool(os.environ.get("QUICK")), Path(tmp))))
