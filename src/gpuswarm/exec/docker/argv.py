"""The ``docker run`` command of one attempt (pure: argument lists in, argument list out).

The container is attached (its output is the client's, which the log pump drains into the
attempt's ``output.log``: docker keeps no log of it, ``--log-driver none``), runs ``--init`` (a
real init as pid 1: signals reach the task, zombies are reaped, and when the task ends the
container ends, taking every process of the attempt with it), never pulls, runs as the invoking
user, and gets its environment by name only (values travel in the client's environment, never on
a command line). Folders are bind-mounted with ``--mount`` (which refuses a missing source;
``-v`` would create it as root) at the same path they have on the host.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.docker.client import LABEL

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
_RUN_KEY = 12
_OWNER_KEY = 8


@dataclass(frozen=True)
class Bind:
    """A host path at ``dest`` inside (``dest`` None: the same path)."""

    src: Path
    dest: Path | None = None
    read_only: bool = False


@dataclass(frozen=True)
class RunArgs:
    """Everything :func:`run_argv` needs; each field one concern of the container."""

    image: str
    name: str
    user: str  # uid:gid
    workdir: Path
    command: Sequence[str]
    labels: Mapping[str, str]
    env_names: Iterable[str]
    binds: Sequence[Bind] = ()
    masks: Sequence[Path] = ()  # host folders hidden inside (an empty tmpfs over them)
    devices: Sequence[str] = ()  # from devices.gpu_args
    network: str | None = None
    shm_size: str | None = None
    extra: Sequence[str] = ()  # the user's docker.args


def run_argv(docker: str, a: RunArgs) -> list[str]:
    """``docker run ...`` for ``a``: the exact list handed to the process (no shell)."""
    argv = [docker, "run", "--name", a.name, "--init", "--log-driver", "none", "--pull", "never"]
    argv += ["--user", a.user, "--workdir", str(a.workdir)]
    for key, value in sorted(a.labels.items()):
        argv += ["--label", f"{LABEL}.{key}={value}"]
    for name in sorted(set(a.env_names)):
        argv += ["--env", name]
    for bind in a.binds:
        fields = ["type=bind", f"source={bind.src}", f"destination={bind.dest or bind.src}"]
        if bind.read_only:
            fields.append("readonly")
        argv += ["--mount", ",".join(_csv(f) for f in fields)]
    for mask in a.masks:
        argv += ["--mount", ",".join(_csv(f) for f in ("type=tmpfs", f"destination={mask}"))]
    if a.network is not None:
        argv += ["--network", a.network]
    if a.shm_size is not None:
        argv += ["--shm-size", a.shm_size]
    argv += [*a.devices, *a.extra, a.image, *a.command]
    return argv


def _csv(field: str) -> str:
    """One field of ``--mount``'s CSV value, quoted when a path holds a comma or a quote."""
    if "," in field or '"' in field:
        return '"' + field.replace('"', '""') + '"'
    return field


def run_key(run_dir: str) -> str:
    """The run's part of its containers' names: 12 hex digits of the run folder's sha256."""
    return hashlib.sha256(run_dir.encode()).hexdigest()[:_RUN_KEY]


def owner_key(owner: str) -> str:
    """The supervisor's part of its containers' names: 8 hex digits of its owner id's sha256."""
    return hashlib.sha256(owner.encode()).hexdigest()[:_OWNER_KEY]


def container_name(token: str, suffix: str, *, run_dir: str = "", owner: str = "") -> str:
    """``gpuswarm-<run key>-<owner key>-<run>-<task>-<n>-<suffix>``: the keys (:func:`run_key`,
    :func:`owner_key`) are what resume, a reclaim and the end of a run find the containers by
    (``--name`` is gpuswarm's alone: refused in ``docker.args``); the rest, from the attempt's
    token (``run/task/n``) in the characters docker allows, is for people to read."""
    keys = f"{run_key(run_dir)}-{owner_key(owner)}"
    text = _NAME_BAD.sub("-", token.replace("/", "-")).strip("-.")[:80]
    return f"gpuswarm-{keys}-{text}-{suffix}" if text else f"gpuswarm-{keys}-{suffix}"


def name_pattern(*, run_dir: str | None = None, owner: str | None = None) -> str:
    """The regular expression the names of run ``run_dir``'s (or supervisor ``owner``'s)
    containers match from their start (docker's ``--filter name=`` and Python's re alike)."""
    run = run_key(run_dir) if run_dir is not None else f"[0-9a-f]{{{_RUN_KEY}}}"
    own = owner_key(owner) if owner is not None else f"[0-9a-f]{{{_OWNER_KEY}}}"
    return f"gpuswarm-{run}-{own}-"


def same_path_binds(paths: Iterable[Path]) -> list[Bind]:
    """Read-write binds at the same path of ``paths``, none inside another (that one covers it)."""
    out: list[Path] = []
    for path in sorted({Path(p) for p in paths}, key=lambda p: (len(p.parts), str(p))):
        if not any(path == o or path.is_relative_to(o) for o in out):
            out.append(path)
    return [Bind(p) for p in out]


def masks_for(run_dir: Path, binds: Iterable[Bind], keep: Iterable[Path]) -> list[Path]:
    """Where, inside the container, the folders of the run it must not see are: its queue
    (``.parallel``) and the other slots' homes, wherever a bind reaches them, at the bind's
    destination (``docker.mounts: [{src: /, dest: /host}]`` shows the queue at
    ``/host<run>/.parallel``). Paths are compared resolved, as docker resolves a bind's
    source. ``keep`` (the slot's own home, bound again over the mask) is never masked."""
    real_run = RunPaths(run_dir.resolve())
    kept = set(keep)
    out: list[Path] = []
    for bind in binds:
        src = bind.src.resolve()
        dest = bind.dest or bind.src
        for real in (real_run.parallel, real_run.homes):
            if not (real == src or real.is_relative_to(src)):
                continue
            at = dest / real.relative_to(src)
            if at not in kept and at not in out:
                out.append(at)
    return out
