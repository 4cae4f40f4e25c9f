"""A stand-in for ``pynvml`` (nvidia-ml-py): put this folder first on ``PYTHONPATH`` and
``import pynvml`` finds it. Its machine is a folder named by ``$FAKE_NVML_DIR``:

- ``gpus.json``: ``{"gpus": [{"name", "uuid", "memory_mb", "util", "pci", "mig": [{"uuid",
  "memory_mb"}]}], "api": "v3"|"v2"|"v1"|"none", "init_error": bool, "hide_used": bool,
  "util_error": bool, "base_used_mb": int}``. ``api`` is the newest process query the "driver"
  answers (older: FunctionNotFound, ``none``: NotSupported); ``hide_used``: per-process memory
  is NVML_VALUE_NOT_AVAILABLE (as in some containers).
- ``procs/<name>.json``: ``{"pid", "gpu" (uuid), "mb", "linger_until"}``, one per process
  holding memory. A process is listed while its pid lives (not a zombie), or until
  ``linger_until`` (a driver that frees a dead process's memory late, a leaked context).

- ``energy/<index>.mj``: GPU ``index``'s total-energy counter in millijoules (absent: 0; a
  task adds to it with ``fake_gpu_task.py --energy-j J``). ``"energy": "none"`` on a GPU of
  gpus.json: the counter is NOT_SUPPORTED (a pre-Volta GPU); ``"power_mw"``: its power draw
  while a process is on it (else 10% of it), for the fallback.

Tasks "allocate" through ``fake_gpu_task.py`` beside this folder, which writes those files.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_UNKNOWN = 999
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
MB = 1 << 20


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_FunctionNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_FUNCTION_NOT_FOUND)


class NVMLError_NotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_FOUND)


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Proc:
    pid: int
    usedGpuMemory: int | None


@dataclass
class _Pci:
    busId: str


_inits = 0


def _dir() -> Path:
    return Path(os.environ["FAKE_NVML_DIR"])


def _state() -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((_dir() / "gpus.json").read_text())
    except (OSError, ValueError, KeyError):
        raise NVMLError(NVML_ERROR_UNKNOWN) from None
    return data


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


_listing: tuple[float, list[dict[str, Any]]] = (0.0, [])
LISTING_SECONDS = 0.02  # one look at procs/ serves the calls of one sample of every GPU


def _listed() -> list[dict[str, Any]]:
    global _listing
    now = time.monotonic()
    if now - _listing[0] < LISTING_SECONDS:
        return _listing[1]
    found = []
    for path in sorted((_dir() / "procs").glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # being written
    _listing = (now, found)
    return found


def _procs_of(uuid: str) -> list[tuple[int, int]]:
    """(pid, MiB) of the processes listed on the device ``uuid`` now."""
    out = []
    now = time.time()
    for p in _listed():
        if p.get("gpu") != uuid:
            continue
        if _alive(int(p["pid"])) or now < float(p.get("linger_until") or 0):
            out.append((int(p["pid"]), int(p["mb"])))
    return out


def _device(h: _Handle) -> dict[str, Any]:
    gpus = _state()["gpus"]
    if not isinstance(h, _Handle) or not 0 <= h.gpu < len(gpus):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    gpu: dict[str, Any] = gpus[h.gpu]
    if h.mig is None:
        return gpu
    migs = gpu.get("mig") or []
    if not 0 <= h.mig < len(migs):
        raise NVMLError_NotFound()
    mig: dict[str, Any] = {"name": f"{gpu['name']} MIG", **migs[h.mig], "is_mig": True}
    return mig


def _need_init() -> None:
    if _inits <= 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


# -- the pynvml API gpuswarm uses ------------------------------------------------------------------
def nvmlInit() -> None:
    global _inits
    if _state().get("init_error"):
        raise NVMLError(NVML_ERROR_UNKNOWN)
    _inits += 1


def nvmlShutdown() -> None:
    global _inits
    _need_init()
    _inits -= 1


def nvmlDeviceGetCount() -> int:
    _need_init()
    return len(_state()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _need_init()
    if not 0 <= index < len(_state()["gpus"]):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(index)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> _Handle:
    _need_init()
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for i, gpu in enumerate(_state()["gpus"]):
        if gpu.get("uuid") == text:
            return _Handle(i)
        for k, mig in enumerate(gpu.get("mig") or []):
            if mig.get("uuid") == text:
                return _Handle(i, k)
    raise NVMLError_NotFound()


def nvmlDeviceGetName(h: _Handle) -> str:
    return str(_device(h)["name"])


def nvmlDeviceGetUUID(h: _Handle) -> str:
    return str(_device(h)["uuid"])


def nvmlDeviceGetPciInfo(h: _Handle) -> _Pci:
    return _Pci(str(_device(h).get("pci") or f"00000000:{h.gpu + 1:02X}:00.0"))


def nvmlDeviceGetMemoryInfo(h: _Handle) -> _Memory:
    dev = _device(h)
    total = int(dev["memory_mb"]) * MB
    used = int(_state().get("base_used_mb") or 0) + sum(mb for _, mb in _procs_of(dev["uuid"]))
    used = min(total, used * MB)
    return _Memory(total, total - used, used)


def nvmlDeviceGetUtilizationRates(h: _Handle) -> _Util:
    dev = _device(h)
    if dev.get("is_mig") or _state().get("util_error"):
        raise NVMLError_NotSupported()
    busy = bool(_procs_of(dev["uuid"]))
    return _Util(int(dev.get("util", 50)) if busy else 0, 0)


def nvmlDeviceGetMigMode(h: _Handle) -> list[int]:
    dev = _device(h)
    on = 1 if dev.get("mig") else 0
    return [on, on]


def nvmlDeviceGetMaxMigDeviceCount(h: _Handle) -> int:
    return len(_device(h).get("mig") or [])


def nvmlDeviceGetMigDeviceHandleByIndex(h: _Handle, index: int) -> _Handle:
    _device(_Handle(h.gpu, index))
    return _Handle(h.gpu, index)


def nvmlDeviceGetTotalEnergyConsumption(h: _Handle) -> int:
    dev = _device(h)
    if dev.get("is_mig") or dev.get("energy") == "none":
        raise NVMLError_NotSupported()
    try:
        return int((_dir() / "energy" / f"{h.gpu}.mj").read_text() or 0)
    except FileNotFoundError:
        return 0


def nvmlDeviceGetPowerUsage(h: _Handle) -> int:
    dev = _device(h)
    if dev.get("is_mig") or "power_mw" not in dev:
        raise NVMLError_NotSupported()
    busy = bool(_procs_of(dev["uuid"]))
    return int(dev["power_mw"]) if busy else int(dev["power_mw"]) // 10


def _processes(h: _Handle, version: str) -> list[_Proc]:
    api = _state().get("api", "v3")
    if api == "none":
        raise NVMLError_NotSupported()
    if {"v3": 3, "v2": 2, "v1": 1}[api] < {"v3": 3, "v2": 2, "v1": 1}[version]:
        raise NVMLError_FunctionNotFound()  # a library newer than its driver
    dev = _device(h)
    hidden = bool(_state().get("hide_used"))
    return [
        _Proc(pid, NVML_VALUE_NOT_AVAILABLE if hidden else mb * MB)
        for pid, mb in _procs_of(dev["uuid"])
    ]


def nvmlDeviceGetComputeRunningProcesses(h: _Handle) -> list[_Proc]:
    return _processes(h, "v1")


def nvmlDeviceGetComputeRunningProcesses_v2(h: _Handle) -> list[_Proc]:
    return _processes(h, "v2")


def __getattr__(name: str) -> Any:
    """``_v3`` exists only where the "library" is new enough (``"library": "old"``: absent)."""
    if name == "nvmlDeviceGetComputeRunningProcesses_v3" and _state().get("library") != "old":
        return lambda h: _processes(h, "v3")
    raise AttributeError(name)
