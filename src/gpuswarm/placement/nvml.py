"""The one door to the GPU driver's management library: NVML (``pynvml``, from nvidia-ml-py) or,
for AMD, ``amdsmi`` where it is installed. Discovery (:mod:`.probes`), the VRAM sampler
(:mod:`.vram`), ``--gpus auto:free`` and the live table all ask through :func:`open_query`.

What it reads, per device: name, UUID, total/used memory, utilisation and the compute processes
with the memory each holds. MIG instances (UUIDs ``MIG-...``) are devices of their own, listed
in place of their parent GPU.

Driver and library versions disagree in the field: the process query exists as ``_v3``, ``_v2``
or plain (a library newer than its driver raises FunctionNotFound for the newer one), a MIG
instance answers NOT_SUPPORTED for utilisation, a container may report a process's memory as
"not available", and any call may fail. Every call here is guarded: what cannot be read is
``None`` ("not measured"), never an exception to the caller. Nothing here uses psutil or runs
a process; attributing a pid to an attempt is the sampler's business, with pids the backends
give it.

The module imported is ``pynvml`` (``amdsmi``), as Python finds it: a stand-in earlier on
``PYTHONPATH`` replaces it (the tests' fake NVML does).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

NOT_AVAILABLE = 1 << 63  # NVML_VALUE_NOT_AVAILABLE is 2**64-1: anything this large is no value
MB = 1 << 20

__all__ = [
    "DeviceInfo",
    "DeviceSample",
    "GpuQuery",
    "ProcUse",
    "open_query",
]


@dataclass(frozen=True)
class DeviceInfo:
    """One device as discovery lists it: a whole GPU or a MIG instance."""

    index: int  # position in the list (nvidia-smi's index where no GPU is split into MIG)
    name: str
    uuid: str | None
    memory_mb: int | None
    pci: str | None = None
    parent: int | None = None  # a MIG instance: its parent GPU's NVML index


@dataclass(frozen=True)
class ProcUse:
    pid: int
    used_mb: int | None  # None: the driver does not say (a container, an old driver)


@dataclass(frozen=True)
class DeviceSample:
    """One look at a device. ``procs`` None: its process list could not be read."""

    used_mb: int | None
    total_mb: int | None
    util: int | None  # percent; None where unsupported (MIG) or unreadable
    procs: tuple[ProcUse, ...] | None


class GpuQuery(Protocol):
    vendor: str  # "nvidia" / "amd"

    def devices(self) -> list[DeviceInfo]:
        """Every device, MIG instances in place of their parent; [] when nothing answers."""

    def sample(self, uuid_or_index: str | int) -> DeviceSample:
        """One look at a device by UUID (or list index); fields unreadable are None."""

    def close(self) -> None: ...

    # issue 37: energy. None where the device or driver does not say.
    def energy_mj(self, uuid_or_index: str | int) -> int | None:
        """The device's total-energy counter (millijoules since the driver loaded)."""

    def power_mw(self, uuid_or_index: str | int) -> int | None:
        """The device's power draw now (milliwatts)."""


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip()
    return str(value).strip()


def _mb(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return None if number < 0 or number >= NOT_AVAILABLE else number // MB


# -- NVML ----------------------------------------------------------------------------------------
class NvmlQuery:
    """NVML through a ``pynvml`` module (nvmlInit once per query; nvmlShutdown at close)."""

    vendor = "nvidia"

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: tuple[type[BaseException], ...] = (
            getattr(nvml, "NVMLError", OSError),
            OSError,
            AttributeError,
            TypeError,
            ValueError,
        )
        self._handles: dict[str | int, Any] = {}
        self._proc_calls: list[str] | None = None  # the process queries that answered
        self._closed = False

    @classmethod
    def open(cls, nvml: Any = None) -> NvmlQuery | None:
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                return None
        query = cls(nvml)
        try:
            nvml.nvmlInit()
        except query.errors:
            return None
        except Exception:  # a broken library is "no NVML", never a crash
            return None
        return query

    def _call(self, name: str, *args: Any) -> Any:
        """``nvml.<name>(*args)``, or None when it is missing or fails."""
        fn: Callable[..., Any] | None = getattr(self.nvml, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.errors:
            return None
        except Exception:
            return None

    def _device(self, handle: Any, index: int, parent: int | None) -> DeviceInfo:
        name = _text(self._call("nvmlDeviceGetName", handle) or "") or "NVIDIA GPU"
        uuid = _text(self._call("nvmlDeviceGetUUID", handle) or "") or None
        mem = self._call("nvmlDeviceGetMemoryInfo", handle)
        pci_info = self._call("nvmlDeviceGetPciInfo", handle) if parent is None else None
        pci = _text(getattr(pci_info, "busId", "") or "") or None if pci_info else None
        if uuid:
            self._handles[uuid] = handle
        self._handles[index] = handle
        total = _mb(getattr(mem, "total", None)) if mem is not None else None
        return DeviceInfo(index, name, uuid, total, pci.lower() if pci else None, parent)

    def _migs(self, handle: Any) -> list[Any]:
        mode = self._call("nvmlDeviceGetMigMode", handle)
        current = mode[0] if isinstance(mode, list | tuple) and mode else mode
        if not current:  # None (unsupported) or 0 (disabled)
            return []
        count = self._call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        out = []
        for i in range(int(count)):
            mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, i)
            if mig is not None:
                out.append(mig)
        return out

    def devices(self) -> list[DeviceInfo]:
        count = self._call("nvmlDeviceGetCount")
        if not isinstance(count, int):
            return []
        out: list[DeviceInfo] = []
        for gpu in range(count):
            handle = self._call("nvmlDeviceGetHandleByIndex", gpu)
            if handle is None:
                continue
            migs = self._migs(handle)
            if not migs:
                out.append(self._device(handle, len(out), None))
            for mig in migs:
                out.append(self._device(mig, len(out), gpu))
        return out

    def _handle(self, key: str | int) -> Any:
        handle = self._handles.get(key)
        if handle is None:
            if isinstance(key, str):
                handle = self._call("nvmlDeviceGetHandleByUUID", key)
            else:
                self.devices()
                handle = self._handles.get(key)
            if handle is not None:
                self._handles[key] = handle
        return handle

    def _procs(self, handle: Any) -> tuple[ProcUse, ...] | None:
        """Compute processes through the newest query this driver answers (v3, v2, plain)."""
        names = self._proc_calls or [
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "nvmlDeviceGetComputeRunningProcesses",
        ]
        for name in names:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                continue
            try:
                infos = fn(handle)
            except Exception:  # FunctionNotFound (library newer than driver), NotSupported, ...
                continue
            self._proc_calls = [name]  # the next samples ask this one first (and only)
            try:
                return tuple(
                    ProcUse(int(p.pid), _mb(getattr(p, "usedGpuMemory", None))) for p in infos
                )
            except (TypeError, ValueError, AttributeError):
                return None
        self._proc_calls = None
        return None

    def sample(self, uuid_or_index: str | int) -> DeviceSample:
        handle = self._handle(uuid_or_index)
        if handle is None:
            return DeviceSample(None, None, None, None)
        mem = self._call("nvmlDeviceGetMemoryInfo", handle)
        rates = self._call("nvmlDeviceGetUtilizationRates", handle)
        util = getattr(rates, "gpu", None) if rates is not None else None
        return DeviceSample(
            _mb(getattr(mem, "used", None)) if mem is not None else None,
            _mb(getattr(mem, "total", None)) if mem is not None else None,
            util if isinstance(util, int) and 0 <= util <= 100 else None,
            self._procs(handle),
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call("nvmlShutdown")

    def energy_mj(self, uuid_or_index: str | int) -> int | None:
        """``nvmlDeviceGetTotalEnergyConsumption`` (Volta and newer; NOT_SUPPORTED elsewhere
        and on MIG instances: None)."""
        handle = self._handle(uuid_or_index)
        value = (
            None if handle is None else self._call("nvmlDeviceGetTotalEnergyConsumption", handle)
        )
        return _counter(value)

    def power_mw(self, uuid_or_index: str | int) -> int | None:
        handle = self._handle(uuid_or_index)
        value = None if handle is None else self._call("nvmlDeviceGetPowerUsage", handle)
        return _counter(value)


def _counter(value: Any) -> int | None:
    """A non-negative integer reading, or None (absent, mistyped, NVML_VALUE_NOT_AVAILABLE)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < NOT_AVAILABLE else None


# -- amdsmi (optional) -----------------------------------------------------------------------
class AmdSmiQuery:
    """AMD GPUs through ``amdsmi`` (ROCm's Python bindings), where installed."""

    vendor = "amd"

    def __init__(self, amd: Any, handles: list[Any]) -> None:
        self.amd = amd
        self._handles = handles
        self._uuids: dict[str, int] = {}

    @classmethod
    def open(cls, amd: Any = None) -> AmdSmiQuery | None:
        try:
            amd = amd or importlib.import_module("amdsmi")
            amd.amdsmi_init()
            handles = list(amd.amdsmi_get_processor_handles())
        except Exception:  # not installed, no driver: no AMD query
            return None
        return cls(amd, handles) if handles else None

    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self.amd, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except Exception:
            return None

    def devices(self) -> list[DeviceInfo]:
        out = []
        for i, h in enumerate(self._handles):
            uuid = self._call("amdsmi_get_gpu_device_uuid", h)
            vram = self._call("amdsmi_get_gpu_vram_usage", h) or {}
            asic = self._call("amdsmi_get_gpu_asic_info", h) or {}
            bdf = self._call("amdsmi_get_gpu_device_bdf", h)
            name = asic.get("market_name") if isinstance(asic, dict) else None
            total = vram.get("vram_total") if isinstance(vram, dict) else None
            if isinstance(uuid, str) and uuid:
                self._uuids[uuid] = i
            out.append(
                DeviceInfo(
                    i,
                    _text(name) if name else "AMD GPU",
                    uuid if isinstance(uuid, str) and uuid else None,
                    int(total) if isinstance(total, int) else None,  # amdsmi says MB already
                    bdf if isinstance(bdf, str) and bdf else None,
                )
            )
        return out

    def _procs(self, handle: Any) -> tuple[ProcUse, ...] | None:
        listed = self._call("amdsmi_get_gpu_process_list", handle)
        if not isinstance(listed, list):
            return None
        out = []
        for item in listed:
            info = (
                item
                if isinstance(item, dict)
                else self._call("amdsmi_get_gpu_process_info", handle, item)
            )
            if not isinstance(info, dict) or not isinstance(info.get("pid"), int):
                continue
            mem = info.get("memory_usage")
            vram = mem.get("vram_mem") if isinstance(mem, dict) else info.get("mem")
            out.append(ProcUse(int(info["pid"]), _mb(vram)))
        return tuple(out)

    def sample(self, uuid_or_index: str | int) -> DeviceSample:
        i = self._uuids.get(uuid_or_index, -1) if isinstance(uuid_or_index, str) else uuid_or_index
        if not 0 <= i < len(self._handles):
            return DeviceSample(None, None, None, None)
        h = self._handles[i]
        vram = self._call("amdsmi_get_gpu_vram_usage", h) or {}
        act = self._call("amdsmi_get_gpu_activity", h) or {}
        used = vram.get("vram_used") if isinstance(vram, dict) else None
        total = vram.get("vram_total") if isinstance(vram, dict) else None
        util = act.get("gfx_activity") if isinstance(act, dict) else None
        return DeviceSample(
            int(used) if isinstance(used, int) else None,
            int(total) if isinstance(total, int) else None,
            util if isinstance(util, int) and 0 <= util <= 100 else None,
            self._procs(h),
        )

    def close(self) -> None:
        self._call("amdsmi_shut_down")

    def energy_mj(self, uuid_or_index: str | int) -> int | None:
        return None  # not read on AMD yet: the power samples stand in (placement/energy.py)

    def power_mw(self, uuid_or_index: str | int) -> int | None:
        return None


def open_query(vendor: str = "nvidia") -> GpuQuery | None:
    """The query for ``vendor``'s GPUs, or None where its library or driver is absent."""
    if vendor == "nvidia":
        return NvmlQuery.open()
    if vendor == "amd":
        return AmdSmiQuery.open()
    return None


def foreign_pids(query: GpuQuery, keys: Sequence[str | int]) -> dict[str | int, list[int]]:
    """The compute processes on each device of ``keys`` (every one is foreign before a run
    starts); a device whose list cannot be read is left out."""
    out: dict[str | int, list[int]] = {}
    for key in keys:
        procs = query.sample(key).procs
        if procs is not None:
            out[key] = [p.pid for p in procs]
    return out
