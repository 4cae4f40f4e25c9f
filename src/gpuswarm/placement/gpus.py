"""GPU discovery, ``--gpus`` parsing, worker slots and the per-attempt isolation environment.

GPU ids are *host* ids, as ``nvidia-smi`` / ``rocm-smi`` print them. ``--gpus auto`` asks NVML
(``pynvml``), ``nvidia-smi``, ``amd-smi list`` (JSON, then text) and ``rocm-smi --showid``, in
that order; the first that finds a GPU wins. If gpuswarm itself runs with
``CUDA_VISIBLE_DEVICES`` (NVIDIA) or ``ROCR_VISIBLE_DEVICES`` (AMD) set, e.g. in a Slurm job,
``auto`` keeps only the GPUs listed there, read as host ids or GPU UUID (prefixes), and explicit
ids are checked against that set. An empty value counts as unset; one that cannot be mapped
(``MIG-...``, an absent id) is refused. :func:`plan_slots` makes one slot per group of
``gpus_per_task`` consecutive GPUs, ``tasks_per_gpu`` times over; one worker runs per slot.

Environment of one attempt (:func:`isolation_env`), replacing the supervisor's values:

- NVIDIA and simulated: ``CUDA_VISIBLE_DEVICES`` = host ids (``"2,3"``) and
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA numbers GPUs as nvidia-smi does.
- AMD, masked on the host side by ROCr first: ``ROCR_VISIBLE_DEVICES`` = host ids; HIP numbers
  what is left from 0, so ``HIP_VISIBLE_DEVICES``, ``CUDA_VISIBLE_DEVICES`` (HIP reads it too)
  and ``GPU_DEVICE_ORDINAL`` (OpenCL) = ``"0,..,k-1"``.
- Always: ``GPUSWARM_GPU_IDS`` (host ids, comma-separated), ``GPUSWARM_HOST_GPU_ID`` (the first),
  ``GPUSWARM_SLOT`` (slot index), ``GPUSWARM_GPU_VENDOR`` (``nvidia``/``amd``/``sim``); simulated
  GPUs (``--gpus sim:N``) add ``GPUSWARM_SIMULATED=1``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeAlias

from gpuswarm.core.errors import GpuSpecError

Runner: TypeAlias = Callable[[list[str]], "str | None"]

SIM_MAX = 1024
RUN_TIMEOUT_S = 20.0
NVIDIA_SMI_ARGV = [
    "nvidia-smi",
    "--query-gpu=index,name,uuid,memory.total",
    "--format=csv,noheader,nounits",
]
SPEC_FORMS = (
    "use 'auto', GPU ids such as '0,1,2', ranges such as '0-3' or '0,2-3', "
    "or 'sim:N' to simulate N GPUs"
)
NO_GPU_MESSAGE = (
    "no GPU was found by NVML, nvidia-smi, amd-smi or rocm-smi; "
    "pass --gpus sim:N to simulate N GPUs, or --gpus 0,1 to name the GPUs to use"
)
_INT_RE = re.compile(r"[0-9]+")
_RANGE_RE = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?")
_SIM_RE = re.compile(r"sim:\s*(\S*)", re.IGNORECASE)
_ROCM_LINE_RE = re.compile(r"^GPU\[([0-9]+)\]\s*:\s*([^:]+?)\s*:\s*(.*?)\s*$", re.MULTILINE)
_AMD_TEXT_GPU_RE = re.compile(r"^GPU:\s*([0-9]+)\s*$")
_AMD_TEXT_UUID_RE = re.compile(r"^\s+UUID:\s*(\S+)\s*$")


class Vendor(str, Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    SIM = "sim"


@dataclass(frozen=True)
class Gpu:
    index: int  # host GPU id as nvidia-smi / rocm-smi print it
    name: str
    vendor: Vendor
    uuid: str | None = None
    memory_mb: int | None = None


@dataclass(frozen=True)
class GpuSet:
    vendor: Vendor
    gpus: tuple[Gpu, ...]
    spec: str  # the spec string it came from, e.g. "auto", "0,1", "sim:4"

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def describe(self) -> str:
        """``"GPUs 0-3 (NVIDIA H100 80GB HBM3)"``, ``"GPUs 0-2 (2x A, 1x B)"``: for messages."""
        counts = Counter(g.name for g in self.gpus)
        names = ", ".join(f"{n}x {name}" if len(counts) > 1 else name for name, n in counts.items())
        noun = "GPU" if len(self.gpus) == 1 else "GPUs"
        return f"{noun} {format_ids(sorted(self.ids))} ({names})"


@dataclass(frozen=True)
class Slot:
    index: int  # 0..n-1, stable
    gpu_ids: tuple[int, ...]  # host GPU ids this slot owns (len == gpus_per_task)
    vendor: Vendor
    share: int = 0  # 0..tasks_per_gpu-1: which of the slots sharing these GPUs this is
    ident: str = ""  # the slot id registered in the run (unique there): see slot_id()

    @property
    def label(self) -> str:
        """The slot's id in its run once registered (``<host>-gpu3``, ``<host>-gpu3.1``);
        before that ``gpu0``, ``gpu0+1`` (two GPUs), ``gpu0#1`` (second slot sharing gpu0)."""
        if self.ident:
            return self.ident
        base = "gpu" + "+".join(str(i) for i in self.gpu_ids)
        return f"{base}#{self.share}" if self.share else base


def slot_id(host: str, gpu_ids: Sequence[int], share: int) -> str:
    """``<host>-gpu3``; ``<host>-gpu3.1`` for the second slot on gpu3 (``tasks_per_gpu``, or a
    second supervisor of this host on that GPU); ``<host>-gpu0+1`` for a two-GPU slot."""
    base = f"{host}-gpu" + "+".join(str(i) for i in gpu_ids)
    return f"{base}.{share}" if share else base


def format_ids(ids: Iterable[int]) -> str:
    """Ids in the order given, consecutive runs folded: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


# -- running tools
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


def _as_int(text: str) -> int | None:
    text = text.strip()
    return int(text) if _INT_RE.fullmatch(text) else None


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip()
    return str(value).strip()


# -- NVML
def _nvml_gpu(nvml: Any, index: int, errors: tuple[type[BaseException], ...]) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(nvml.nvmlDeviceGetName(handle))
    uuid: str | None = None
    memory_mb: int | None = None
    with contextlib.suppress(*errors):
        uuid = _text(nvml.nvmlDeviceGetUUID(handle)) or None
    with contextlib.suppress(*errors):
        memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // (1024 * 1024)
    return Gpu(index, name or "NVIDIA GPU", Vendor.NVIDIA, uuid, memory_mb)


def nvml_gpus(nvml: Any = None) -> list[Gpu]:
    """GPUs NVML reports; [] when pynvml is missing or NVML fails (no driver, no GPU)."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return []
    errors: tuple[type[BaseException], ...] = (getattr(nvml, "NVMLError", OSError), OSError)
    try:
        nvml.nvmlInit()
    except errors:
        return []
    try:
        return [_nvml_gpu(nvml, i, errors) for i in range(int(nvml.nvmlDeviceGetCount()))]
    except errors:
        return []
    finally:
        with contextlib.suppress(*errors):
            nvml.nvmlShutdown()


# -- tool output parsers
def parse_nvidia_smi(out: str) -> list[Gpu]:
    """``index, name, uuid, memory.total`` CSV lines (noheader, nounits)."""
    gpus: list[Gpu] = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        index = _as_int(parts[0])
        if len(parts) < 4 or index is None:
            continue
        uuid = parts[-2] if parts[-2] and not parts[-2].startswith("[") else None
        name = ", ".join(parts[1:-2]) or "NVIDIA GPU"
        gpus.append(Gpu(index, name, Vendor.NVIDIA, uuid, _as_int(parts[-1])))
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
            uuid = item.get("uuid")
            gpus.append(Gpu(index, "AMD GPU", Vendor.AMD, uuid if isinstance(uuid, str) else None))
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


# -- discovery
def _find_gpus(nvml: Any, run: Runner) -> list[Gpu]:
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


_VISIBLE_VAR = {Vendor.NVIDIA: "CUDA_VISIBLE_DEVICES", Vendor.AMD: "ROCR_VISIBLE_DEVICES"}


def _visible_id(token: str, found: GpuSet, setting: str) -> int:
    index = _as_int(token)
    if index is not None and index in found.ids:
        return index
    prefix = token.lower()
    matches = [g.index for g in found.gpus if prefix and (g.uuid or "").lower().startswith(prefix)]
    if index is None and len(matches) == 1:
        return matches[0]
    raise GpuSpecError(
        f"{setting} is set in gpuswarm's environment, but {token!r} is not one of this machine's "
        f"{found.describe()} (by id or UUID); unset it, or pass --gpus 0,1 to name the GPUs"
    )


def _restrict_to_visible(found: GpuSet, environ: Mapping[str, str]) -> GpuSet:
    var = _VISIBLE_VAR.get(found.vendor)
    value = environ.get(var, "").strip() if var else ""
    if not var or not value:
        return found
    ids = dict.fromkeys(_visible_id(t.strip(), found, f"{var}={value}") for t in value.split(","))
    by_id = {g.index: g for g in found.gpus}
    return GpuSet(found.vendor, tuple(by_id[i] for i in ids), found.spec)


def discover(
    *,
    nvml: Any = None,
    run: Runner | None = None,
    environ: Mapping[str, str] | None = None,
) -> GpuSet:
    """The GPUs of this machine (spec ``"auto"``), restricted by a visible-devices variable.

    ``nvml`` replaces the ``pynvml`` module and ``run`` the tool runner (:func:`run_tool`);
    ``environ`` replaces ``os.environ``. Raises :class:`GpuSpecError` when nothing finds a GPU.
    """
    gpus = _find_gpus(nvml, run or run_tool)
    if not gpus:
        raise GpuSpecError(NO_GPU_MESSAGE)
    found = GpuSet(gpus[0].vendor, tuple(gpus), "auto")
    return _restrict_to_visible(found, os.environ if environ is None else environ)


# -- --gpus
def _sim_gpus(spec: str, count_text: str) -> GpuSet:
    count = _as_int(count_text)
    if count is None or not 1 <= count <= SIM_MAX:
        raise GpuSpecError(
            f"--gpus {spec}: the number of simulated GPUs must be a whole number from 1 to "
            f"{SIM_MAX}, e.g. --gpus sim:4"
        )
    gpus = tuple(Gpu(i, "sim", Vendor.SIM) for i in range(count))
    return GpuSet(Vendor.SIM, gpus, f"sim:{count}")


def _parse_ids(spec: str) -> list[int]:
    ids: list[int] = []
    for token in (t.strip() for t in spec.split(",")):
        m = _RANGE_RE.fullmatch(token)
        if not m:
            what = "an empty entry" if not token else f"{token!r}, which is not a GPU id or range"
            raise GpuSpecError(f"--gpus {spec!r} has {what}; {SPEC_FORMS}")
        low, high = int(m[1]), int(m[2] or m[1])
        if high < low:
            raise GpuSpecError(f"--gpus {spec}: range {token} runs backwards; write {high}-{low}")
        if high - low >= SIM_MAX:
            raise GpuSpecError(f"--gpus {spec}: range {token} is larger than {SIM_MAX} GPUs")
        ids.extend(range(low, high + 1))
    for index, n in Counter(ids).items():
        if n > 1:
            raise GpuSpecError(f"GPU {index} is listed twice in --gpus {spec}; list it once")
    return ids


def _select(spec: str, ids: list[int], found: GpuSet) -> GpuSet:
    by_id = {g.index: g for g in found.gpus}
    unknown = [str(i) for i in ids if i not in by_id]
    if unknown:
        what = f"GPU {unknown[0]} does not exist"
        if len(unknown) > 1:
            what = f"GPUs {', '.join(unknown)} do not exist"
        raise GpuSpecError(
            f"--gpus {spec}: {what}; this machine has {found.describe()}{_hidden_hint(found)}"
        )
    return GpuSet(found.vendor, tuple(by_id[i] for i in ids), spec)


def _hidden_hint(found: GpuSet) -> str:
    var = _VISIBLE_VAR.get(found.vendor, "")
    value = os.environ.get(var, "").strip() if var else ""
    return f" ({var}={value} in gpuswarm's environment hides the others)" if value else ""


def parse_gpu_spec(spec: str, *, discover_fn: Callable[[], GpuSet] = discover) -> GpuSet:
    """Turn a ``--gpus`` value into the GPUs to use, in the order given.

    ``auto`` discovers; ``sim:N`` simulates N GPUs without discovery; ``0,1``, ``0-3`` and
    ``0,2-3`` name host ids, which must exist (checked with ``discover_fn``) and be distinct.
    """
    text = spec.strip()
    if not text:
        raise GpuSpecError(f"--gpus is empty; {SPEC_FORMS}")
    if text.lower() == "auto":
        return discover_fn()
    sim = _SIM_RE.fullmatch(text)
    if sim:
        return _sim_gpus(text, sim[1])
    ids = _parse_ids(text)
    try:
        found = discover_fn()
    except GpuSpecError as exc:
        raise GpuSpecError(f"--gpus {text}: {exc}") from None
    return _select(text, ids, found)


# -- slots and isolation
def plan_slots(gpus: GpuSet, gpus_per_task: int = 1, tasks_per_gpu: int = 1) -> list[Slot]:
    """Slots of ``gpus_per_task`` consecutive GPUs, ``tasks_per_gpu`` slots per GPU group.

    Slots ``0..groups-1`` cover distinct GPUs; the next ``groups`` slots share them again, so a
    supervisor that starts fewer workers than slots still spreads them over all GPUs.
    """
    for name, value in (("gpus_per_task", gpus_per_task), ("tasks_per_gpu", tasks_per_gpu)):
        if value < 1:
            raise GpuSpecError(f"{name}: {value} must be at least 1")
    ids = gpus.ids
    if not ids:
        raise GpuSpecError(f"--gpus {gpus.spec} selects no GPU; {SPEC_FORMS}")
    if len(ids) % gpus_per_task:
        k = gpus_per_task
        raise GpuSpecError(
            f"gpus_per_task: {k} needs the GPU count ({len(ids)}: {','.join(map(str, ids))}) "
            f"to be a multiple of {k}; pass --gpus with a multiple of {k} GPUs"
        )
    groups = [ids[i : i + gpus_per_task] for i in range(0, len(ids), gpus_per_task)]
    pairs = [(share, group) for share in range(tasks_per_gpu) for group in groups]
    return [Slot(n, group, gpus.vendor, share) for n, (share, group) in enumerate(pairs)]


def isolation_env(slot: Slot, gpu_ids: Sequence[int] | None = None) -> dict[str, str]:
    """Environment variables that confine one attempt to its GPUs (see the module docstring).

    ``gpu_ids`` picks a non-empty subset of the slot's GPUs (default: all of them); anything else
    is a caller bug and raises ValueError.
    """
    ids = slot.gpu_ids if gpu_ids is None else tuple(gpu_ids)
    if not ids or len(set(ids)) != len(ids) or not set(ids) <= set(slot.gpu_ids):
        raise ValueError(f"gpu_ids {list(ids)} is not a non-empty subset of slot {slot.label}")
    host = ",".join(str(i) for i in ids)
    env = {
        "GPUSWARM_GPU_IDS": host,
        "GPUSWARM_HOST_GPU_ID": str(ids[0]),
        "GPUSWARM_SLOT": str(slot.index),
        "GPUSWARM_GPU_VENDOR": slot.vendor.value,
    }
    if slot.vendor is Vendor.AMD:
        logical = ",".join(str(i) for i in range(len(ids)))
        env["ROCR_VISIBLE_DEVICES"] = host
        env["HIP_VISIBLE_DEVICES"] = logical
        env["CUDA_VISIBLE_DEVICES"] = logical
        env["GPU_DEVICE_ORDINAL"] = logical
    else:
        env["CUDA_VISIBLE_DEVICES"] = host
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if slot.vendor is Vendor.SIM:
        env["GPUSWARM_SIMULATED"] = "1"
    return env
