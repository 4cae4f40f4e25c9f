"""A variant's exported tree (its commit plus links to the experiment's untracked paths) and the
protected files a variant must not change, checked in that export and in the user's data.

The export is the variant task's working directory: made from scratch before it is queued
(a crash may have cut an earlier one short) and removed once the variant is recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from gpuswarm.research import gitops
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, file_sha256
from gpuswarm.research.journal import Variant


def export(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> Path:
    """The variant's tree in its own folder (re-made from scratch: a crash may have cut it)."""
    dest = paths.export_dir(v.id)
    if dest.exists():
        remove_export(paths, v.id)
    paths.variants.mkdir(exist_ok=True)
    tmp = paths.variants / f".{v.id}.partial"
    remove_tree(tmp)
    gitops.export(paths.repo, v.commit, tmp)
    for rel in cfg.link:
        src = paths.repo / rel
        if src.exists() and not (tmp / rel).exists():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).symlink_to(src)
    os.rename(tmp, dest)
    return dest


def remove_tree(path: Path) -> None:
    """Remove an export; it may hold read-only folders a training run created."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            with contextlib.suppress(OSError):
                (Path(root) / d).chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)


def remove_export(paths: ExpPaths, variant_id: str) -> None:
    remove_tree(paths.export_dir(variant_id))


def protected_changes(paths: ExpPaths, cfg: ExperimentConfig, v: Variant) -> list[str]:
    """Protected files whose content in the export differs from BASE's (before or after)."""
    changed = []
    root = paths.export_dir(v.id)
    for rel in cfg.protect:
        if rel in cfg.protect_sums:
            continue  # untracked: checked by checksum after the run (protected_data_changes)
        want = gitops.blob(paths.repo, v.parent, rel)
        try:
            have: bytes | None = (root / rel).read_bytes()
        except OSError:
            have = None
        if want is None or have is None or _sha(want) != _sha(have):
            changed.append(rel)
    return changed


def protected_data_changes(paths: ExpPaths, cfg: ExperimentConfig) -> list[str]:
    """Protected untracked files (linked into every run) whose checksum is not the one
    recorded at init: a run wrote into the user's data."""
    changed = []
    for rel, want in cfg.protect_sums.items():
        try:
            have = file_sha256(paths.repo / rel)
        except OSError:
            have = ""
        if have != want:
            changed.append(rel)
    return changed


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
