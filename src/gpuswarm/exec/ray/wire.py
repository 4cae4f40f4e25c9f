"""What travels between the driver and a slot actor, and the node-side staging of an attempt.

Pure Python (no ``ray`` import): the driver builds an attempt's :func:`wire` from its
:class:`~gpuswarm.exec.base.LaunchSpec`, the actor turns it back into a spec for the node
(:func:`node_spec`), running in place where the node sees the run folder (a shared filesystem:
the driver's probe file reads back) or in a node-local stage otherwise: the run folder's paths
are mapped to ``<stage>/root``, the attempt's folder (its cwd outside the run) to a shipped copy
(:func:`pack_tree` / :func:`unpack_tree`), and what the attempt wrote in its task folder comes
home with its outcome (:func:`collect_outputs` on the node, :func:`write_outputs` on the driver),
``max_result_mb`` at most.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from gpuswarm.core.fsutil import atomic_write_bytes
from gpuswarm.core.paths import RAY_PROBE, RunPaths
from gpuswarm.core.taskfiles import inside, read_limited
from gpuswarm.exec.base import LaunchSpec

# variables the attempt always takes from the driver's spec (its GPUs, its identity), even
# when the driver's own environment happens to hold the same value
_OWN_PREFIXES = ("GPUSWARM_", "CUDA_", "HIP_", "ROCR_", "GPU_DEVICE_ORDINAL")
PROBE_NAME = RAY_PROBE  # in the run's .parallel/: a node that reads it back shares the folder


class TooLarge(ValueError):
    """A shipped folder or an attempt's outputs are over their limit (the message says which)."""


def attempt_env(spec: LaunchSpec) -> dict[str, str]:
    """The variables set for the attempt (``own_env``, its GPUs and identity): the node's own
    environment goes under them there (PATH, HOME of the node, not the driver's)."""
    return {k: v for k, v in spec.env.items() if k in spec.own_env or k.startswith(_OWN_PREFIXES)}


def wire(
    spec: LaunchSpec,
    *,
    root: str,
    probe: str,
    ship: str,
    tree: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The attempt as the actor receives it. ``root``: the run folder on the driver; ``probe``:
    the nonce the driver wrote into it; ``tree``: (key, folder) of a shipped copy of its cwd;
    ``home``: the slot's private HOME (``home.isolate``: a folder of the run), which a node
    that does not see the run folder gets a copy of, its own for the slot from then on."""
    home = spec.env.get("HOME", "")
    return {
        "home": home if home.startswith(root.rstrip("/") + "/") else None,
        "argv": list(spec.argv),
        "env": attempt_env(spec),
        "cwd": str(spec.cwd),
        "timeout": spec.timeout,
        "grace": spec.grace,
        "token": spec.token,
        "root": root,
        "probe": probe,
        "ship": ship,
        "tree": list(tree) if tree else None,
        "identity": dict(spec.identity),
        "log": str(spec.log_path),
    }


def needs_tree(data: Mapping[str, Any]) -> bool:
    """Whether the attempt, on a node that does not see the run folder, needs its cwd shipped
    (a cwd outside the run folder: the config's folder, a research variant's export)."""
    root, cwd = str(data["root"]), str(data["cwd"])
    return data["ship"] != "never" and not (cwd == root or cwd.startswith(root + "/"))


def sees_run_folder(root: str, probe: str) -> bool:
    """Whether this node sees the driver's run folder (its probe file holds ``probe``)."""
    try:
        return read_limited(RunPaths(Path(root)).ray_probe, 256).decode() == probe
    except (OSError, UnicodeDecodeError):
        return False


@dataclass(frozen=True)
class Staged:
    """Where an attempt runs on the node: in place (``stage`` None) or mapped into a stage."""

    spec: LaunchSpec
    stage: Path | None  # <scratch>/<token>/root stands for the run folder
    task_dir: Path | None  # the staged task folder whose files come home


def _mapper(pairs: list[tuple[str, str]]) -> Any:
    def map_text(text: str) -> str:
        for old, new in pairs:
            if text == old or text.startswith(old + "/"):
                return new + text[len(old) :]
            text = text.replace(old + "/", new + "/")
        return text

    return map_text


def home_dir(data: Mapping[str, Any], scratch: Path) -> Path | None:
    """Where the slot's shipped HOME lives on a node that does not see the run folder (one per
    slot, kept across its attempts); None when it has no private HOME or ``ship: never``."""
    home = data.get("home")
    if not home or data["ship"] == "never":
        return None
    return scratch / "homes" / hashlib.sha256(str(home).encode()).hexdigest()[:16]


def node_spec(
    data: Mapping[str, Any],
    base_env: Mapping[str, str],
    scratch: Path,
    tree: Path | None,
    home: Path | None = None,
) -> Staged:
    """The attempt's spec on this node: in place where the node sees the run folder (and
    ``ship`` is not ``always``), else its paths mapped into a fresh stage under ``scratch``
    (the slot's HOME to ``home``, its node copy, when there is one)."""
    token = str(data["token"])
    safe = hashlib.sha256(token.encode()).hexdigest()[:16]
    log = scratch / "logs" / f"{safe}.log"
    env = {k: v for k, v in base_env.items() if not k.startswith("RAY_")}
    env.update(data["env"])
    root, cwd = str(data["root"]), str(data["cwd"])
    shared = data["ship"] != "always" and sees_run_folder(root, str(data["probe"]))
    if shared:
        spec = LaunchSpec(
            argv=list(data["argv"]),
            env=env,
            cwd=Path(cwd),
            log_path=log,
            timeout=data["timeout"],
            grace=float(data["grace"]),
            token=token,
        )
        return Staged(spec, None, None)
    stage = scratch / "stage" / safe / "root"
    pairs = [(root, str(stage))]
    if tree is not None and data.get("tree"):
        pairs.insert(0, (str(data["tree"][1]), str(tree)))
    if home is not None and data.get("home"):
        pairs.insert(0, (str(data["home"]), str(home)))
    map_text = _mapper(pairs)
    task_dir = Path(map_text(str(env.get("GPUSWARM_TASK_WORKSPACE", root))))
    task_dir.mkdir(parents=True, exist_ok=True)
    mapped_cwd = Path(map_text(cwd))
    mapped_cwd.mkdir(parents=True, exist_ok=True)
    mapped_home = map_text(env.get("HOME", ""))
    if mapped_home.startswith(str(stage) + "/"):  # a private HOME not shipped (ship: never)
        Path(mapped_home).mkdir(parents=True, exist_ok=True, mode=0o700)
    spec = LaunchSpec(
        argv=[map_text(a) for a in data["argv"]],
        env={k: map_text(v) for k, v in env.items()},
        cwd=mapped_cwd,
        log_path=log,
        timeout=data["timeout"],
        grace=float(data["grace"]),
        token=token,
    )
    return Staged(spec, stage, task_dir)


# -- shipping a folder to the node --------------------------------------------------------------
def pack_tree(folder: Path, limit: int) -> tuple[str, bytes]:
    """The folder as a gzipped tar (symlinks kept as links, never followed) and its key;
    TooLarge once it packs to more than ``limit`` bytes (``ray.max_ship_mb``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        tar.add(str(folder), arcname=".", recursive=True)
    data = buf.getvalue()
    if len(data) > limit:
        raise TooLarge(
            f"{folder} packs to {len(data) / (1 << 20):.1f} MiB, over ray.max_ship_mb "
            f"({limit / (1 << 20):.1f} MiB); put large inputs under ray.shared_path (or raise "
            "max_ship_mb)"
        )
    return hashlib.sha256(data).hexdigest()[:24], data


def unpack_tree(data: bytes, dest: Path) -> None:
    """Unpack a shipped folder into ``dest`` (made whole or not at all: a temp name, renamed)."""
    if dest.is_dir():
        return
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            # nothing outside dest, no devices; symlinks kept (a --link to shared data)
            tar.extractall(tmp, filter="tar")
        else:  # pragma: no cover - Python without the extraction filters
            for member in tar.getmembers():
                if member.name.startswith("/") or ".." in PurePosixPath(member.name).parts:
                    raise TooLarge(f"shipped folder has an unsafe member {member.name!r}")
            tar.extractall(tmp)
    try:
        os.rename(tmp, dest)
    except OSError:  # another slot of this node unpacked it first
        if not dest.is_dir():
            raise


# -- the attempt's outputs come home -------------------------------------------------------------
def collect_outputs(task_dir: Path, limit: int) -> list[tuple[str, bytes]]:
    """Every regular file under the staged task folder (symlinks and special files left out;
    ``attempt-*`` folders are the driver's), ``limit`` bytes in all at most (TooLarge past it)."""
    out: list[tuple[str, bytes]] = []
    total = 0
    for folder, dirs, files in os.walk(task_dir):
        here = Path(folder)
        dirs[:] = [d for d in dirs if not (here == task_dir and d.startswith("attempt-"))]
        for name in files:
            path = here / name
            with contextlib.suppress(OSError):
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                total += os.lstat(path).st_size
                if total > limit:
                    raise TooLarge(
                        f"the attempt's outputs in its task folder are over ray.max_result_mb "
                        f"({limit / (1 << 20):.1f} MiB); write large artifacts under "
                        "ray.shared_path"
                    )
                out.append((str(path.relative_to(task_dir)), read_limited(path, limit)))
    return out


def write_outputs(task_dir: Path, files: list[tuple[str, bytes]]) -> list[str]:
    """Write an attempt's returned files into its task folder on the driver; a name that would
    leave the folder (``..``, a symlink planted on the way) is refused. Returns those written."""
    written = []
    for rel, data in files:
        parts = PurePosixPath(rel).parts
        if not parts or rel.startswith("/") or ".." in parts or parts[0].startswith("attempt-"):
            continue
        target = inside(task_dir, str(PurePosixPath(*parts[:-1]) if parts[:-1] else "."))
        target.mkdir(parents=True, exist_ok=True)
        target = inside(task_dir, str(PurePosixPath(*parts[:-1]) if parts[:-1] else "."))
        dest = target / parts[-1]
        if dest.is_symlink():
            dest.unlink()
        atomic_write_bytes(dest, data)
        written.append(rel)
    return written
