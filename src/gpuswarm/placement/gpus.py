"""GPU discovery, ``--gpus`` parsing, worker slots and the per-attempt isolation environment.

GPU ids are *host* ids, as ``nvidia-smi`` / ``rocm-smi`` print them. ``--gpus auto`` asks NVML
(``pynvml``), ``nvidia-smi``, ``amd-smi list`` (JSON, then text) and ``rocm-smi --showid``, in
that order (the backends and their parsers: :mod:`gpuswarm.placement.probes`; the records:
:mod:`gpuswarm.placement.devices`); the first that finds a GPU wins. If gpuswarm itself runs with
``CUDA_VISIBLE_DEVICES`` (NVIDIA) or ``ROCR_VISIBLE_DEVICES`` (AMD) set, e.g. in a Slurm job,
``auto`` keeps only the GPUs listed there, read as host ids or GPU UUID (prefixes), and explicit
ids are checked against that set. An empty value counts as unset; one that cannot be mapped
(an absent id) is refused. MIG instances (``MIG-...``) are devices of their own where NVML lists
them (:mod:`gpuswarm.placement.nvml`), found there by UUID and given to attempts by UUID.
``auto:free`` keeps the GPUs without a compute process (:func:`free_gpus`). :func:`plan_slots`
makes one slot per group of ``gpus_per_task`` consecutive GPUs, ``tasks_per_gpu`` times over;
one worker runs per slot.

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

import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuswarm.core.errors import GpuSpecError
from gpuswarm.placement import slurmgpus
from gpuswarm.placement.devices import Gpu, GpuSet, Vendor, as_int, format_ids
from gpuswarm.placement.nvml import GpuQuery, open_query
from gpuswarm.placement.probes import Runner, find_gpus, run_tool

SIM_MAX = 1024
SPEC_FORMS = (
    "use 'auto' (or 'auto:free': GPUs without another process), GPU ids such as '0,1,2', "
    "ranges such as '0-3' or '0,2-3', or 'sim:N' to simulate N GPUs ('sim:2xA100,2xH100': "
    "named ones)"
)
NO_GPU_MESSAGE = (
    "no GPU was found by NVML, nvidia-smi, amd-smi or rocm-smi; "
    "pass --gpus sim:N to simulate N GPUs, or --gpus 0,1 to name the GPUs to use"
)
_RANGE_RE = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?")
_SIM_RE = re.compile(r"sim:\s*(.*?)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Slot:
    index: int  # 0..n-1, stable
    gpu_ids: tuple[int, ...]  # host GPU ids this slot owns (len == gpus_per_task)
    vendor: Vendor
    share: int = 0  # 0..tasks_per_gpu-1: which of the slots sharing these GPUs this is
    ident: str = ""  # the slot id registered in the run (unique there): see slot_id()
    # what discovery knows of gpu_ids (uuid, PCI address), in order; not part of its identity
    devices: tuple[Gpu, ...] = field(default=(), compare=False)
    host: str = field(default="", compare=False)  # its machine when not this one (a cluster's)

    def devices_of(self, gpu_ids: Sequence[int]) -> tuple[Gpu, ...]:
        """The records of ``gpu_ids`` (a bare record where discovery gave none)."""
        known = {g.index: g for g in self.devices}
        return tuple(known.get(i) or Gpu(i, "GPU", self.vendor) for i in gpu_ids)

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


_VISIBLE_VAR = {Vendor.NVIDIA: "CUDA_VISIBLE_DEVICES", Vendor.AMD: "ROCR_VISIBLE_DEVICES"}


def _visible_id(token: str, found: GpuSet, setting: str) -> int:
    index = as_int(token)
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
    env = os.environ if environ is None else environ
    if slurmgpus.in_allocation(env) and not slurmgpus.on_compute_node(env):
        raise slurmgpus.not_on_node_error()
    gpus = find_gpus(nvml, run or run_tool)
    if not gpus:
        sim = slurmgpus.simulated(env)  # a Slurm test cluster's gres (issue 36)
        if sim is not None:
            return sim
        raise GpuSpecError(NO_GPU_MESSAGE)
    found = GpuSet(gpus[0].vendor, tuple(gpus), "auto")
    granted = slurmgpus.restrict(found, env)  # inside a Slurm allocation: what it granted
    return granted if granted is not None else _restrict_to_visible(found, env)


# -- --gpus
_SIM_GROUP_RE = re.compile(r"([0-9]+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9 ._-]{0,63})")


def _sim_memory(spec: str, text: str) -> tuple[str, int | None]:
    """``text`` without its ``@SIZE`` suffix, and that size in MiB (None: none given)."""
    head, at, size = text.partition("@")
    if not at:
        return text, None
    # config.values loads pydantic and yaml: only here, never for `status` (which loads this
    # module through store.leases) -- its start-up is a budget (README)
    from gpuswarm.config.values import parse_gpu_memory

    try:
        return head.strip(), parse_gpu_memory(size.strip())
    except ValueError as exc:
        raise GpuSpecError(
            f"--gpus {spec}: {exc} (a simulated GPU's memory: sim:4@80G, sim:2xH100@80G)"
        ) from None


def _sim_gpus(spec: str, count_text: str) -> GpuSet:
    """``sim:N`` (N GPUs named ``sim``) or ``sim:2xA100,2xH100`` (named groups: a simulated
    cluster of two GPU models, e.g. to try per-platform research baselines). Each may carry a
    memory size (``sim:4@80G``, ``sim:2xA100@40G,2xH100@80G``, issue 19): placement by
    ``gpu_memory`` then packs by it (nothing is measured on a simulated GPU)."""
    grouped = "x" in count_text.lower()
    plain, memory = (count_text, None) if grouped else _sim_memory(spec, count_text)
    count = as_int(plain)
    if count is not None or not grouped:
        if count is None or not 1 <= count <= SIM_MAX:
            raise GpuSpecError(
                f"--gpus {spec}: the number of simulated GPUs must be a whole number from 1 to "
                f"{SIM_MAX}, e.g. --gpus sim:4 (or named: sim:2xA100,2xH100)"
            )
        gpus = tuple(Gpu(i, "sim", Vendor.SIM, memory_mb=memory) for i in range(count))
        return GpuSet(Vendor.SIM, gpus, f"sim:{count}{_at(memory)}")
    found: list[tuple[str, int | None]] = []
    groups: list[str] = []
    for token in (t.strip() for t in count_text.split(",")):
        bare, memory = _sim_memory(spec, token)
        m = _SIM_GROUP_RE.fullmatch(bare)
        if not m or not 1 <= int(m[1]) <= SIM_MAX:
            raise GpuSpecError(
                f"--gpus {spec}: {token!r} is not a group of simulated GPUs; write NxNAME "
                "groups, e.g. --gpus sim:2xA100,2xH100 (N from 1, a name of letters, digits, "
                "'.', '_', '-'; @80G: its memory)"
            )
        found += [(m[2].strip(), memory)] * int(m[1])
        groups.append(f"{int(m[1])}x{m[2].strip()}{_at(memory)}")
    if len(found) > SIM_MAX:
        raise GpuSpecError(f"--gpus {spec}: at most {SIM_MAX} simulated GPUs")
    gpus = tuple(Gpu(i, name, Vendor.SIM, memory_mb=mb) for i, (name, mb) in enumerate(found))
    return GpuSet(Vendor.SIM, gpus, f"sim:{','.join(groups)}")


def _at(memory: int | None) -> str:
    if memory is None:
        return ""
    return f"@{memory // 1024}G" if memory % 1024 == 0 else f"@{memory}M"


def free_gpus(found: GpuSet, query_fn: Callable[[str], GpuQuery | None]) -> GpuSet:
    """The GPUs of ``found`` without a compute process (``--gpus auto:free``)."""
    query = query_fn(found.vendor.value)
    if query is None:
        raise GpuSpecError(
            f"--gpus auto:free: the processes of {found.describe()} cannot be seen (no NVML or "
            "amdsmi here); pass --gpus auto, or name the GPUs with --gpus 0,1"
        )
    busy: dict[int, list[int]] = {}
    unreadable: list[int] = []
    try:
        for gpu in found.gpus:
            procs = query.sample(gpu.uuid or gpu.index).procs
            if procs is None:
                unreadable.append(gpu.index)
            elif procs:
                busy[gpu.index] = sorted(p.pid for p in procs)
    finally:
        query.close()
    keep = tuple(g for g in found.gpus if g.index not in busy and g.index not in unreadable)
    if not keep:
        used = "; ".join(f"GPU {i}: pids {', '.join(map(str, p))}" for i, p in busy.items())
        blind = f"; GPUs {format_ids(unreadable)}: process list unreadable" if unreadable else ""
        raise GpuSpecError(
            f"--gpus auto:free: every GPU is in use ({used or 'none free'}{blind}); wait for "
            "them, or pass --gpus auto to share them"
        )
    return GpuSet(found.vendor, keep, "auto:free")


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


def parse_gpu_spec(
    spec: str,
    *,
    discover_fn: Callable[[], GpuSet] = discover,
    query_fn: Callable[[str], GpuQuery | None] = open_query,
) -> GpuSet:
    """Turn a ``--gpus`` value into the GPUs to use, in the order given.

    ``auto`` discovers; ``auto:free`` keeps the discovered GPUs no compute process uses now
    (asked through ``query_fn``: NVML, amdsmi); ``sim:N`` simulates N GPUs without discovery;
    ``0,1``, ``0-3`` and ``0,2-3`` name host ids, which must exist (checked with
    ``discover_fn``) and be distinct.
    """
    text = spec.strip()
    if not text:
        raise GpuSpecError(f"--gpus is empty; {SPEC_FORMS}")
    if text.lower() == "auto":
        return discover_fn()
    if text.lower() == "auto:free":
        return free_gpus(discover_fn(), query_fn)
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
    known = {g.index: g for g in gpus.gpus}
    return [
        Slot(n, group, gpus.vendor, share, devices=tuple(known[i] for i in group if i in known))
        for n, (share, group) in enumerate(pairs)
    ]


MAX_PACKED = 16  # slots per GPU that memory packing makes when tasks_per_gpu is not set


def memory_slots(needs: Sequence[int], totals: Sequence[int]) -> int:
    """Slots per GPU for tasks that declare ``gpu_memory`` (MiB ``needs``) on GPUs of
    ``totals`` MiB: as many of the smallest need as the smallest GPU holds (1..16); 1 when
    either is unknown (then memory decides nothing: a simulated GPU has no size)."""
    if not needs or not totals:
        return 1
    return max(1, min(MAX_PACKED, min(totals) // min(needs)))


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
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible(slot, ids)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if slot.vendor is Vendor.SIM:
        env["GPUSWARM_SIMULATED"] = "1"
    return env


def cuda_visible(slot: Slot, ids: Sequence[int]) -> str:
    """``CUDA_VISIBLE_DEVICES`` of ``ids``: host ids, or UUIDs where one is a MIG instance
    (CUDA finds a MIG instance by its ``MIG-...`` UUID only)."""
    devices = slot.devices_of(ids)
    if any((d.uuid or "").startswith("MIG-") for d in devices):
        return ",".join(d.uuid or str(d.index) for d in devices)
    return ",".join(str(i) for i in ids)


def renumbered_env(vendor: Vendor, count: int) -> dict[str, str]:
    """The visibility variables inside a container that was given only the attempt's ``count``
    GPUs: they are devices ``0..count-1`` there (the host ids stay in ``GPUSWARM_*``)."""
    logical = ",".join(str(i) for i in range(count))
    env = {
        "CUDA_VISIBLE_DEVICES": logical,
        "HIP_VISIBLE_DEVICES": logical,
        "GPU_DEVICE_ORDINAL": logical,
    }
    if vendor is Vendor.AMD:
        env["ROCR_VISIBLE_DEVICES"] = logical
    return env
