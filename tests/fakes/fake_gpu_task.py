"""A task that "uses" a fake-NVML GPU (tests/fakes/nvml/pynvml.py): it writes
``$FAKE_NVML_DIR/procs/<pid>.json`` saying how much memory it holds on the GPU that
``CUDA_VISIBLE_DEVICES`` names (a host index or a UUID), holds it, and removes it on exit.

    python fake_gpu_task.py --mb 2000 --hold 1.5 [--children 2 --child-mb 500 --grandchild]
        [--grow] [--oom-at MB (attempt 1 only)] [--linger S] [--check-free] [--energy-j J]

``--check-free``: allocating more than the GPU has free ends the process as a CUDA OOM would
(exit 1, PyTorch's message), under a lock, so two tasks never both see the same free memory.
``--grow``: reach ``--mb`` in 5 steps over the hold. ``--linger S``: the driver "frees" its
memory S seconds after it exited. Children and grandchildren are real processes below it.
``--energy-j J``: half-way through the hold, its GPU's energy counter advances by J joules.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MB = 1 << 20


def _devices() -> list[tuple[str, int]]:
    """(uuid, total MiB) per device, in NVML's order (MIG instances in place of parents)."""
    state = json.loads((Path(os.environ["FAKE_NVML_DIR"]) / "gpus.json").read_text())
    out = []
    for gpu in state["gpus"]:
        for mig in gpu.get("mig") or []:
            out.append((mig["uuid"], int(mig["memory_mb"])))
        if not gpu.get("mig"):
            out.append((gpu["uuid"], int(gpu["memory_mb"])))
    return out


def _my_gpu() -> tuple[str, int]:
    token = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    devices = _devices()
    if token.isdigit():
        return devices[int(token)]
    return next(d for d in devices if d[0] == token)


def _used(uuid: str, procs: Path) -> int:
    sys.path.insert(0, str(Path(__file__).parent / "nvml"))
    import pynvml  # type: ignore[import-untyped]  # the fake: the view gpuswarm has

    pynvml.LISTING_SECONDS = 0  # under the lock: what is there now, never a cached look
    return sum(mb for _, mb in pynvml._procs_of(uuid))


def _write(procs: Path, uuid: str, mb: int, linger: float) -> Path:
    path = procs / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "gpu": uuid, "mb": mb}))
    os.rename(tmp, path)
    return path


def _allocate(procs: Path, uuid: str, total: int, mb: int, check: bool, linger: float) -> Path:
    with (procs / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        mine = procs / f"{os.getpid()}.json"
        had = json.loads(mine.read_text())["mb"] if mine.exists() else 0
        if check and _used(uuid, procs) - had + mb > total:
            free = total - (_used(uuid, procs) - had)
            print(
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                f"{(mb - had) / 1024:.2f} GiB. GPU 0 has a total capacity of {total / 1024:.2f} "
                f"GiB of which {max(0, free) / 1024:.2f} GiB is free.",
                flush=True,
            )
            sys.exit(1)
        return _write(procs, uuid, mb, linger)


def _add_energy(root: Path, joules: float) -> None:
    """The counter of this task's GPU (its NVML index) advances by ``joules``."""
    token = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    index = int(token) if token.isdigit() else [u for u, _ in _devices()].index(token)
    folder = root / "energy"
    folder.mkdir(exist_ok=True)
    with (folder / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = folder / f"{index}.mj"
        now = int(path.read_text() or 0) if path.exists() else 0
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(now + round(joules * 1000)))
        os.rename(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--hold", type=float, default=1.5)
    ap.add_argument("--children", type=int, default=0)
    ap.add_argument("--child-mb", type=int, default=0)
    ap.add_argument("--grandchild", action="store_true")
    ap.add_argument("--grow", action="store_true")
    ap.add_argument("--oom-at", type=int, default=0)
    ap.add_argument("--linger", type=float, default=0.0)
    ap.add_argument("--check-free", action="store_true")
    ap.add_argument("--print-env", action="store_true")
    ap.add_argument("--energy-j", type=float, default=0.0)
    args = ap.parse_args()
    if args.print_env:
        print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", ""), flush=True)
    procs = Path(os.environ["FAKE_NVML_DIR"]) / "procs"
    uuid, total = _my_gpu()
    kids = []
    for _ in range(args.children):
        argv = [sys.executable, __file__, "--mb", str(args.child_mb), "--hold", str(args.hold)]
        if args.grandchild:
            argv += ["--children", "1", "--child-mb", str(args.child_mb)]
        kids.append(subprocess.Popen(argv))
    first = os.environ.get("GPUSWARM_ATTEMPT", "1") == "1"
    steps = 5 if args.grow else 1
    path = None
    for k in range(1, steps + 1):
        mb = args.mb * k // steps
        if args.oom_at and first and mb >= args.oom_at:
            print("RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB", flush=True)
            sys.exit(1)
        if mb > 0:
            path = _allocate(procs, uuid, total, mb, args.check_free, args.linger)
        time.sleep(args.hold / steps / 2)
        if args.energy_j and k == steps:
            _add_energy(procs.parent, args.energy_j)
        time.sleep(args.hold / steps / 2)
    for kid in kids:
        kid.wait()
    if path is not None:
        if args.linger > 0:
            data = json.loads(path.read_text())
            data["linger_until"] = time.time() + args.linger
            path.write_text(json.dumps(data))
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


if __name__ == "__main__":
    main()
