"""The quarantine files of a run (``.parallel/quarantine/<slot>@<owner>.json``): written, read,
and lifted by hand.

A live supervisor writes one file per slot its breaker (``supervise/breaker.py``) takes out of
rotation and removes it when a probe succeeds; ``gpuswarm unquarantine`` removes files here and
the supervisors holding them notice within a second. Readers (status, watch, the live table)
and the lifting command reach them through this module, not through the supervisor's code.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, TypedDict

from gpuswarm.core.fsutil import atomic_write_json
from gpuswarm.core.paths import RunPaths


class _Why(TypedDict):
    reason: str


class QuarantineInfo(_Why, total=False):
    """Why a slot is out of rotation, and until when (a quarantine file holds it; the breaker
    writes every key)."""

    gpus: list[int]
    probe_at: float  # epoch seconds of its next probe


class _Held(TypedDict):
    slot: str
    gpus: list[int]
    reason: str
    probe_at: float
    lifted: str | None  # why it ended (a probe succeeded, by hand); None: it goes on


class Quarantined(_Held, total=False):
    """summary.json's record of one quarantine (``quarantined``)."""

    probes: int  # probes that failed since


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.:" else "-" for c in text)


def quarantine_file(paths: RunPaths, slot: str, owner: str) -> Path:
    return paths.quarantine / f"{_safe(slot)}@{_safe(owner)}.json"


def write_quarantine(paths: RunPaths, slot: str, owner: str, info: QuarantineInfo) -> Path:
    """Take ``slot`` of ``owner`` out of rotation durably (its supervisor removes the file when
    a probe succeeds; ``unquarantine`` removes it by hand)."""
    path = quarantine_file(paths, slot, owner)
    path.parent.mkdir(exist_ok=True)
    atomic_write_json(path, {"slot": slot, "owner": owner, "since": time.time(), **info})
    return path


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
