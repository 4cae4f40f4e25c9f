"""A fake NVML machine for tests (issue 19): GPUs, their memory and processes, in a folder that
the stand-in ``pynvml`` (tests/fakes/nvml/pynvml.py) reads. In-process tests load that module
with :func:`load_fake`; CLI tests put it first on ``PYTHONPATH`` with :meth:`FakeMachine.env`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

FAKES = Path(__file__).resolve().parent.parent / "fakes"
NVML_DIR = FAKES / "nvml"
GPU_TASK = FAKES / "fake_gpu_task.py"


def gpu(i: int, memory_mb: int = 16384, **more: Any) -> dict[str, Any]:
    return {"name": "Fake H100", "uuid": f"GPU-fake-{i:04d}", "memory_mb": memory_mb, **more}


@dataclass
class FakeMachine:
    root: Path
    gpus: list[dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    foreign: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        (self.root / "procs").mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        data = {"gpus": self.gpus, **self.settings}
        tmp = self.root / "gpus.json.tmp"
        tmp.write_text(json.dumps(data))
        os.rename(tmp, self.root / "gpus.json")

    def set(self, **settings: Any) -> None:
        self.settings.update(settings)
        self.save()

    def env(self, locks: Path | None = None) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(NVML_DIR), os.environ.get("PYTHONPATH", "")) if p)
        out = {"PYTHONPATH": path, "FAKE_NVML_DIR": str(self.root)}
        out["GPUSWARM_LOCK_DIR"] = str(locks or self.root / "locks")
        return out

    def hold(self, pid: int, uuid: str, mb: int, linger_until: float = 0.0) -> Path:
        """Say that process ``pid`` holds ``mb`` MiB on device ``uuid``."""
        path = self.root / "procs" / f"{pid}.json"
        data = {"pid": pid, "gpu": uuid, "mb": mb, "linger_until": linger_until}
        path.write_text(json.dumps(data))
        return path

    def foreign_process(self, uuid: str, mb: int) -> subprocess.Popen[bytes]:
        """A live process that is no task of any run, holding ``mb`` MiB on ``uuid``."""
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        self.foreign.append(proc)
        self.hold(proc.pid, uuid, mb)
        return proc

    def close(self) -> None:
        for proc in self.foreign:
            proc.kill()
            proc.wait()


def load_fake(root: Path, monkeypatch: Any) -> ModuleType:
    """The stand-in ``pynvml`` loaded in this process (reading ``root``), never cached."""
    monkeypatch.setenv("FAKE_NVML_DIR", str(root))
    name = f"fake_pynvml_{time.monotonic_ns()}"
    spec = importlib.util.spec_from_file_location(name, NVML_DIR / "pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    # a test changes the machine between two looks: never a cached listing
    setattr(module, "LISTING_SECONDS", 0)  # noqa: B010
    return module
