"""The quarantine files of a run (``.parallel/quarantine/<slot>@<owner>.json``): read, and lifted
by hand.

A live supervisor's breaker (``supervise/breaker.py``) writes one file per slot it takes out of
rotation and removes it when a probe succeeds; ``gpuswarm unquarantine`` removes files here and
the supervisors holding them notice within a second. Readers (status, watch, the live table)
and the lifting command reach them through this module, not through the supervisor's code.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from gpuswarm.core.paths import RunPaths


def read_quarantines(paths: RunPaths) -> list[dict[str, Any]]:
    """The quarantine files of a run, each with its file name under ``file``."""
    folder = paths.quarantine
    out = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(folder)):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            with contextlib.suppress(OSError, ValueError):
                data = json.loads((folder / name).read_text())
                if isinstance(data, dict):
                    data["file"] = name
                    out.append(data)
    return out


def lift_by_hand(paths: RunPaths, slot: str | None) -> list[dict[str, Any]]:
    """Remove the quarantine files of ``slot`` (every slot when None); the supervisors holding
    them put the slots back in rotation. Returns what was lifted."""
    lifted = []
    for q in read_quarantines(paths):
        label = str(q.get("slot"))
        if slot is None or label == slot or label.endswith(f"-{slot}"):  # "gpu2" for "vm-gpu2"
            with contextlib.suppress(FileNotFoundError):
                (paths.quarantine / q["file"]).unlink()
                lifted.append(q)
    return lifted
