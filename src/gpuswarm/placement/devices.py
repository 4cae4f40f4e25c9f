"""The GPU records discovery produces: vendor, one GPU, a set of GPUs; id formatting."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

_INT_RE = re.compile(r"[0-9]+")


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
    pci: str | None = None  # PCI address (``0000:c1:00.0``) where discovery reports one


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


def format_ids(ids: Iterable[int]) -> str:
    """Ids in the order given, consecutive runs folded: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def as_int(text: str) -> int | None:
    """A plain non-negative decimal (surrounding blanks allowed), else None."""
    text = text.strip()
    return int(text) if _INT_RE.fullmatch(text) else None


def model_matches(name: str, wanted: str) -> bool:
    """Whether a GPU named ``name`` is of the model a task asks for (``accelerator:``): every
    word of ``wanted`` is a word of the name, in order, any case, a word ending at a space,
    a dash or the end (``H100`` and ``h100 80gb`` match ``NVIDIA H100 80GB HBM3``, ``A100``
    matches ``NVIDIA A100-SXM4-80GB``; ``A10`` does not match ``A100``)."""
    words = wanted.split()
    if not words:
        return True
    pattern = r"\s+".join(re.escape(w) for w in words)
    return re.search(rf"(?<![^\W_]){pattern}(?![^\W_])", name, re.IGNORECASE) is not None
