"""The ``docker`` backend: the Backend seam over containers (see :mod:`gpuswarm.exec.docker`).

One container per attempt, named with keys of its run and owner (``argv.container_name``) and
labelled with its run, owner, task, attempt and slot, so that a resume, a reclaim of a dead
owner, ``gpuswarm check --repair`` and the end of a run find and remove what is left of it by
name (which only gpuswarm sets) and by label (an older gpuswarm's). The slot's private HOME
(always made: it holds the caches the seed's long-lived worker keeps) and the task's workspace
are bind-mounted at their host paths, so logs, completion files and metrics are found exactly as
for local attempts; the run's queue is never visible inside.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import signal
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from gpuswarm.core.errors import BackendError
from gpuswarm.exec.base import BackendOptions, LaunchSpec, Leftovers
from gpuswarm.exec.docker.argv import (
    Bind,
    RunArgs,
    container_name,
    masks_for,
    name_pattern,
    run_argv,
    same_path_binds,
)
from gpuswarm.exec.docker.client import DockerCLI, Listed, signal_container
from gpuswarm.exec.docker.container import ContainerAttempt
from gpuswarm.exec.docker.devices import gpu_args
from gpuswarm.exec.docker.settings import DockerConfig
from gpuswarm.exec.local.backend import LocalBackend
from gpuswarm.exec.sandbox import Provision
from gpuswarm.placement.gpus import renumbered_env

_VISIBILITY = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_VISIBILITY_ALL = (*_VISIBILITY, "GPU_DEVICE_ORDINAL")
# the docker client's own settings: read by the client, never handed to the container
_CLIENT_VARS = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH")
_CLIENT_VARS_TLS = ("DOCKER_TLS_VERIFY", "DOCKER_API_VERSION")


class DockerBackend:
    """Attempts as containers; the docker clients as local attempts (pumped logs)."""

    name = "docker"
    caps_logs = True  # the clients' output goes through the local log pump

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        settings = options.settings
        self.settings = settings if isinstance(settings, DockerConfig) else None
        self._local = LocalBackend(options)
        host = dict(os.environ)
        if "DOCKER_CONFIG" not in host and "HOME" in host:  # a slot HOME must not hide it
            host["DOCKER_CONFIG"] = str(Path(host["HOME"]) / ".docker")
        self._host = host
        self.cli = DockerCLI(host)
        self._user = f"{os.getuid()}:{os.getgid()}"
        self._username = _username()
        self._remover: Remover | None = None  # open() starts it

    # -- before anything runs --------------------------------------------------------------------
    def check(self) -> None:
        settings = self._require()
        self.cli.check_daemon()
        self.cli.check_image(settings.image, "docker.image")
        for i, mount in enumerate(settings.mounts):
            src = self._source(mount.src)
            if not src.exists():
                raise BackendError(
                    f"docker.mounts[{i}].src: {src} does not exist (docker would create it as "
                    "root); create it or fix the path"
                )

    def _require(self) -> DockerConfig:
        if self.settings is None:
            raise BackendError("backend: docker needs a docker: block with the image")
        return self.settings

    def _source(self, src: str) -> Path:
        path = Path(src).expanduser()
        base = Path(self.options.base_dir or ".")
        return path if path.is_absolute() else base / path

    def open(self) -> None:
        self._local.open()
        if self._remover is None:
            self._remover = Remover(self.cli)

    def prepare_slot(self, home: Path | None, provisions: Sequence[Provision]) -> dict[str, str]:
        return self._local.prepare_slot(home, provisions)

    # -- one attempt -----------------------------------------------------------------------------
    def launch(self, spec: LaunchSpec) -> ContainerAttempt:
        settings = self._require()
        name = container_name(
            spec.token, uuid.uuid4().hex[:8], run_dir=self.options.run_dir, owner=self.options.owner
        )
        env = dict(spec.env)
        names = set(spec.own_env) | set(settings.pass_env) | {"USER", "LOGNAME"}
        names -= {*_CLIENT_VARS, *_CLIENT_VARS_TLS}
        env["USER"] = env["LOGNAME"] = self._username  # the uid's name (torch's getuser())
        if spec.devices:
            env.update(renumbered_env(spec.vendor, len(spec.devices)))  # 0..k-1 inside
            names |= set(_VISIBILITY_ALL) & set(env)
        else:
            names -= set(_VISIBILITY_ALL)
        for var in ("DOCKER_CONFIG", *_CLIENT_VARS):
            if var in self._host:
                env[var] = self._host[var]  # the client's own, whatever the task's env says
        run_dir = Path(self.options.run_dir) if self.options.run_dir else None
        user_binds = [Bind(self._source(m.src), Path(m.dest), m.read_only) for m in settings.mounts]
        ours = same_path_binds([*spec.binds, spec.cwd])
        masks = masks_for(run_dir, [*ours, *user_binds], spec.binds) if run_dir else []
        # a bind a mask covers (the slot's HOME under the cwd's bind) is mounted again over the
        # mask: docker mounts the deeper path last
        ours += [
            Bind(b)
            for b in spec.binds
            if any(b == m or b.is_relative_to(m) for m in masks) and Bind(b) not in ours
        ]
        labels = {
            "run": self.options.run_dir,
            "owner": self.options.owner,
            **{k: v for k, v in spec.identity.items() if k in ("kind", "task", "attempt", "slot")},
        }
        args = RunArgs(
            image=settings.image,
            name=name,
            user=self._user,
            workdir=spec.cwd,
            command=spec.argv,
            labels=labels,
            env_names=sorted(names),
            binds=[*ours, *user_binds],
            masks=masks,
            devices=gpu_args(settings.gpu_flags, spec.vendor, spec.devices),
            network=settings.network,
            shm_size=settings.shm_size,
            extra=settings.args,
        )
        client_spec = LaunchSpec(
            argv=run_argv(self.cli.exe, args),
            env=env,
            cwd=spec.cwd,
            log_path=spec.log_path,
            timeout=None,  # the container's timeout is the handle's: never the client's
            grace=spec.grace,
            token=spec.token,
        )
        pump, limit = self._local.pump, self.options.max_log_bytes
        remove = self._remover.put if self._remover is not None else None
        return ContainerAttempt.launch(spec, client_spec, name, self.cli, pump, limit, remove)

    # -- leftovers -------------------------------------------------------------------------------
    def end_leftovers(
        self, *, run_dir: str | None = None, owner: str | None = None, grace: float = 10.0
    ) -> Leftovers:
        """The containers of run ``run_dir`` (resume) or of supervisor ``owner`` (a reclaim):
        TERM to every process of the running ones, ``grace``, then removed (SIGKILL). When
        this returns none of them runs: one still running after its removal is a BackendError
        (the caller requeues nothing: a task never runs beside its old container)."""
        if run_dir is None and owner is None:
            raise ValueError("end_leftovers: give run_dir or owner")
        found = self._ours(run_dir=run_dir, owner=owner)
        if not found:
            self._local.settle_keepers(run_dir=run_dir, owner=owner)
            return Leftovers([], frozenset(), 0)
        running = [c for c in found if c.running]
        tasks = frozenset(
            c.labels["task"]
            for c in running
            if c.labels.get("kind") == "attempt" and c.labels.get("task")
        )
        self._term([c.name for c in running], grace)
        self.cli.remove([c.name for c in found])
        alive = [c.name for c in self._ours(run_dir=run_dir, owner=owner) if c.running]
        if alive:
            raise BackendError(
                f"docker: container(s) {', '.join(alive)} still run after `docker rm --force`; "
                "nothing was requeued: remove them (docker rm --force NAME) and try again"
            )
        self._local.settle_keepers(run_dir=run_dir, owner=owner)  # the clients' logs are whole
        return Leftovers([c.name for c in found], tasks, len(running))

    def _ours(self, *, run_dir: str | None = None, owner: str | None = None) -> list[Listed]:
        """Run ``run_dir``'s (else supervisor ``owner``'s) containers: by the keys in their
        names, which only gpuswarm gives (``--name`` is refused in docker.args; labels are
        not trusted to find them), and by label (containers of an older gpuswarm)."""
        by_name = self.cli.named(name_pattern(run_dir=run_dir, owner=owner))
        label, value = ("run", run_dir) if run_dir is not None else ("owner", owner or "")
        names = {c.name for c in by_name}
        return by_name + [c for c in self.cli.listed(label, value) if c.name not in names]

    def _term(self, names: Sequence[str], grace: float) -> None:
        if not names or grace <= 0:
            return
        for name in names:
            signal_container(self.cli, name, signal.SIGTERM)
        deadline = time.monotonic() + grace
        left = list(names)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [n for n in left if (s := self.cli.inspect(n)) is not None and s.running]

    def leftovers(self, run_dir: str) -> list[int | str]:
        """The names of run ``run_dir``'s containers that are still there (``check``)."""
        return [c.name for c in self._ours(run_dir=run_dir)]

    def close(self) -> None:
        """After the last attempt: this supervisor's containers that are still there go."""
        remover, self._remover = self._remover, None
        try:
            if remover is not None:
                remover.close()  # every ended attempt's container removed
            if self.options.owner:
                strays = self._ours(owner=self.options.owner)
                self.cli.remove([c.name for c in strays])
        finally:
            self._local.close()


class Remover:
    """Removes ended attempts' containers in a thread of its own, in order, so a slot claims its
    next task without waiting for ``docker rm`` (the container has ended: its GPU is free). A
    removal that fails is left to the labels (close(), resume, check --repair)."""

    def __init__(self, cli: DockerCLI) -> None:
        self._cli = cli
        self._names: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="docker-rm", daemon=True)
        self._thread.start()

    def put(self, name: str) -> None:
        self._names.put(name)

    def _serve(self) -> None:
        while (name := self._names.get()) is not None:
            with contextlib.suppress(BackendError):
                self._cli.remove([name])

    def close(self) -> None:
        """Every container put so far is removed (or its removal failed) when this returns."""
        self._names.put(None)
        self._thread.join()


def _username() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return os.environ.get("USER") or str(os.getuid())
