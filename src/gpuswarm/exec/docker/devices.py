"""The device flags of ``docker run`` that hand a container exactly the attempt's GPUs.

- ``nvidia``: ``--gpus '"device=<uuid>,<uuid>"'``. Docker reads the value of ``--gpus`` as CSV,
  so an unquoted ``device=0,1`` is the field ``device=0`` and a stray ``1``: one GPU. The
  embedded double quotes keep the list whole (argv, no shell: the quotes are literal).
- ``cdi``: ``--device nvidia.com/gpu=<uuid>`` (``amd.com/gpu=<index>`` for AMD), one per GPU.
- ``amd``: ``--device /dev/kfd`` and the GPU's own render node, ``/dev/dri/renderD<N>``, found
  from its PCI address in sysfs (``/sys/bus/pci/devices/<bdf>/drm/renderD*``): render minors
  are not ``128 + index`` once a machine has other DRM devices or GPUs in another order. Where
  discovery gave no PCI address, the KFD topology (the order ROCm numbers GPUs in) gives it.
  ``--group-add`` adds the nodes' groups (video, render): the task runs as the invoking user.
- ``none`` (and ``auto`` on simulated GPUs): no device.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpuswarm.core.errors import BackendError
from gpuswarm.placement.devices import Gpu, Vendor

SYSFS = Path("/sys")
DEV = Path("/dev")
_KFD_NODES = "class/kfd/kfd/topology/nodes"


def flags_mode(mode: str, vendor: Vendor) -> str:
    """``auto`` made concrete by vendor: nvidia, amd, or none (simulated GPUs)."""
    if mode != "auto":
        return mode
    return {Vendor.NVIDIA: "nvidia", Vendor.AMD: "amd"}.get(vendor, "none")


def gpu_args(
    mode: str, vendor: Vendor, gpus: Sequence[Gpu], *, sysfs: Path = SYSFS, dev: Path = DEV
) -> list[str]:
    """The ``docker run`` arguments that give a container ``gpus`` and nothing else."""
    mode = flags_mode(mode, vendor)
    if mode == "none" or not gpus:
        return []
    if mode == "nvidia":
        ids = ",".join(g.uuid or str(g.index) for g in gpus)
        return ["--gpus", f'"device={ids}"']
    if mode == "cdi":
        kind = "amd.com/gpu" if vendor is Vendor.AMD else "nvidia.com/gpu"
        out: list[str] = []
        for g in gpus:
            ident = str(g.index) if vendor is Vendor.AMD else (g.uuid or str(g.index))
            out += ["--device", f"{kind}={ident}"]
        return out
    if mode == "amd":
        nodes = [dev / "kfd", *(render_node(g, sysfs=sysfs, dev=dev) for g in gpus)]
        out = []
        for node in nodes:
            out += ["--device", str(node)]
        for gid in sorted({_gid(node) for node in nodes}):
            out += ["--group-add", str(gid)]
        return out
    raise BackendError(
        f"docker.gpu_flags: unknown mode {mode!r}; use auto, nvidia, amd, cdi or none"
    )


def _gid(node: Path) -> int:
    try:
        return node.stat().st_gid
    except OSError as exc:
        raise BackendError(
            f"{node}: {exc.strerror or exc}; is the AMD GPU driver (amdgpu, ROCm) loaded on this "
            "host? (or set docker.gpu_flags: none)"
        ) from None


def render_node(gpu: Gpu, *, sysfs: Path = SYSFS, dev: Path = DEV) -> Path:
    """``/dev/dri/renderD<N>`` of ``gpu``, through its PCI address in sysfs."""
    pci = (gpu.pci or kfd_pci(gpu.index, sysfs) or "").lower()
    if not pci:
        raise BackendError(
            f"GPU {gpu.index}: no PCI address for it (amd-smi gave none, and {sysfs / _KFD_NODES} "
            "lists no such GPU); set docker.gpu_flags: cdi, or none and pass devices in args"
        )
    drm = sysfs / "bus/pci/devices" / pci / "drm"
    try:
        names = sorted(p.name for p in drm.iterdir() if p.name.startswith("renderD"))
    except OSError:
        names = []
    if not names:
        raise BackendError(
            f"GPU {gpu.index} (PCI {pci}): no render node in {drm}; is the amdgpu driver bound "
            "to it? (or set docker.gpu_flags: none and pass devices in args)"
        )
    return dev / "dri" / names[0]


def kfd_pci(index: int, sysfs: Path = SYSFS) -> str | None:
    """The PCI address of ROCm's GPU ``index``: the index-th GPU node of the KFD topology (CPU
    nodes have no SIMDs), from its ``domain`` and ``location_id`` (bus << 8 | device << 3 |
    function)."""
    root = sysfs / _KFD_NODES
    try:
        nodes = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    except OSError:
        return None
    gpus = [props for node in nodes if (props := _properties(node / "properties"))]
    gpus = [p for p in gpus if p.get("simd_count", 0) > 0]
    if index >= len(gpus):
        return None
    props = gpus[index]
    loc = props.get("location_id")
    if loc is None:
        return None
    domain = props.get("domain", 0)
    return f"{domain:04x}:{loc >> 8 & 0xFF:02x}:{loc >> 3 & 0x1F:02x}.{loc & 0x7}"


def _properties(path: Path) -> dict[str, int]:
    """``name value`` lines of a KFD node's properties file (a small sysfs file)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")[:65536]
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out
