"""The machine a benchmark ran on: CPU, cores, RAM, OS, Python, temp filesystem, commit, tools."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import psutil
from common import REPO


def _first_line(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "not installed"
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))}, kernel {platform.release()}"
    except OSError:
        pass
    return platform.platform()


def filesystem_of(path: Path) -> str:
    best = None
    target = str(path.resolve())
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") or "/"
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) > len(best.mountpoint)):
            best = part
    if best is None:
        return "unknown"
    return f"{best.fstype} ({best.device} on {best.mountpoint})"


def _commit() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "src")
    return head + (" + uncommitted changes in src/" if dirty else "")


def _docker() -> str:
    """The docker engine's version (client and server), or why there is none."""
    if shutil.which("docker") is None:
        return "not installed"
    fmt = "Docker Engine {{.Server.Version}} (client {{.Client.Version}})"
    try:
        out = subprocess.run(
            ["docker", "version", "--format", fmt],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "CLI only: no engine answers"


def describe(work: Path) -> dict[str, str]:
    mem = psutil.virtual_memory().total / 2**30
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    physical = psutil.cpu_count(logical=False)
    return {
        "CPU": _cpu_model(),
        "cores": f"{os.cpu_count()} logical" + (f", {physical} physical" if physical else ""),
        "RAM": f"{mem:.1f} GiB",
        "OS": _os_name(),
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "temp filesystem": f"{work.parent}: {filesystem_of(work)}",
        "gpuswarm": f"{_version('gpuswarm')}, commit {_commit()}",
        "GNU parallel": _first_line(["parallel", "--version"]),
        "xargs": _first_line(["xargs", "--version"]),
        "simple_gpu_scheduler": _version("simple_gpu_scheduler"),
        "Ray": _version("ray"),
        "docker": _docker(),
        "load average at start (1, 5, 15 min)": load,
    }
