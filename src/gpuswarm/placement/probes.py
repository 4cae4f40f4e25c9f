"""GPU discovery backends: NVML (``pynvml``), ``nvidia-smi``, ``amd-smi`` (JSON, then text) and
``rocm-smi --showid``, asked in that order by :func:`find_gpus`, and the parsers of their output.

Tools run without a shell and with a timeout (:func:`run_tool`); a missing, failing or hanging
tool counts as "found nothing", so the next backend is asked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any, TypeAlias

from gpuswarm.placement.devices import Gpu, Vendor, as_int
from gpuswarm.placement.nvml import NvmlQuery

Runner: TypeAlias = Callable[[list[str]], "str | None"]

RUN_TIMEOUT_S = 20.0
NVIDIA_SMI_ARGV = [
    "nvidia-smi",
    "--query-gpu=index,name,uuid,memory.total",
    "--format=csv,noheader,nounits",
]
_ROCM_LINE_RE = re.compile(r"^GPU\[([0-9]+)\]\s*:\s*([^:]+?)\s*:\s*(.*?)\s*$", re.MULTILINE)
_AMD_TEXT_GPU_RE = re.compile(r"^GPU:\s*([0-9]+)\s*$")
_AMD_TEXT_UUID_RE = re.compile(r"^\s+UUID:\s*(\S+)\s*$")


def run_tool(argv: list[str]) -> str | None:
    """stdout of ``argv``, or None when the tool is missing, fails or times out. No shell."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *argv[1:]],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


# -- NVML
def nvml_gpus(nvml: Any = None) -> list[Gpu]:
    """GPUs NVML reports, MIG instances in place of their parent (:mod:`.nvml`); [] when pynvml
    is missing or NVML fails (no driver, no GPU)."""
    query = NvmlQuery.open(nvml)
    if query is None:
        return []
    try:
        return [
            Gpu(d.index, d.name, Vendor.NVIDIA, d.uuid, d.memory_mb, d.pci) for d in query.devices()
        ]
    finally:
        query.close()


# -- tool output parsers
def parse_nvidia_smi(out: str) -> list[Gpu]:
    """``index, name, uuid, memory.total`` CSV lines (noheader, nounits)."""
    gpus: list[Gpu] = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        index = as_int(parts[0])
        if len(parts) < 4 or index is None:
            continue
        uuid = parts[-2] if parts[-2] and not parts[-2].startswith("[") else None
        name = ", ".join(parts[1:-2]) or "NVIDIA GPU"
        gpus.append(Gpu(index, name, Vendor.NVIDIA, uuid, as_int(parts[-1])))
    return gpus


def parse_amd_smi_json(out: str) -> list[Gpu]:
    """``amd-smi list --json``: a list of ``{"gpu": 0, "bdf": ..., "uuid": ...}`` objects."""
    starts = [i for i in (out.find("["), out.find("{")) if i >= 0]
    if not starts:
        return []
    try:
        data, _ = json.JSONDecoder().raw_decode(out, min(starts))
    except ValueError:
        return []
    if isinstance(data, dict):
        data = data.get("gpu_data", [data])
    gpus: list[Gpu] = []
    for item in data if isinstance(data, list) else []:
        index = item.get("gpu") if isinstance(item, dict) else None
        if isinstance(index, int) and not isinstance(index, bool):
            uuid, bdf = item.get("uuid"), item.get("bdf")
            gpus.append(
                Gpu(
                    index,
                    "AMD GPU",
                    Vendor.AMD,
                    uuid if isinstance(uuid, str) else None,
                    pci=bdf if isinstance(bdf, str) and bdf else None,
                )
            )
    return gpus


def parse_amd_smi_text(out: str) -> list[Gpu]:
    """Plain ``amd-smi list``: ``GPU: 0`` blocks with indented ``UUID:`` lines."""
    found: dict[int, str | None] = {}
    current: int | None = None
    for line in out.splitlines():
        gpu = _AMD_TEXT_GPU_RE.match(line)
        uuid = _AMD_TEXT_UUID_RE.match(line)
        if gpu:
            current = int(gpu[1])
            found[current] = None
        elif uuid and current is not None:
            found[current] = uuid[1]
    return [Gpu(i, "AMD GPU", Vendor.AMD, u) for i, u in found.items()]


def parse_rocm_smi(out: str) -> list[Gpu]:
    """``rocm-smi --showid``: lines like ``GPU[0]\t\t: Device ID: \t0x74a1``."""
    fields: dict[int, dict[str, str]] = {}
    for m in _ROCM_LINE_RE.finditer(out):
        fields.setdefault(int(m[1]), {})[m[2].lower()] = m[3]
    gpus: list[Gpu] = []
    for index, info in fields.items():
        device_id = info.get("device id", "")
        fallback = f"AMD GPU {device_id}" if device_id.startswith("0x") else "AMD GPU"
        gpus.append(Gpu(index, info.get("device name") or fallback, Vendor.AMD))
    return gpus


def find_gpus(nvml: Any, run: Runner) -> list[Gpu]:
    """The GPUs the first backend that finds any reports (NVML, then the tools), by id."""
    finders: list[Callable[[], list[Gpu]]] = [
        lambda: nvml_gpus(nvml),
        lambda: parse_nvidia_smi(run(NVIDIA_SMI_ARGV) or ""),
        lambda: parse_amd_smi_json(run(["amd-smi", "list", "--json"]) or ""),
        lambda: parse_amd_smi_text(run(["amd-smi", "list"]) or ""),
        lambda: parse_rocm_smi(run(["rocm-smi", "--showid"]) or ""),
    ]
    for find in finders:
        gpus = find()
        if gpus:
            return sorted({g.index: g for g in gpus}.values(), key=lambda g: g.index)
    return []
