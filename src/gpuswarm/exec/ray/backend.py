"""The ``ray`` backend: every GPU of a Ray cluster a slot, the run folder still on the driver.

The supervisor is the Ray driver and the only writer of the run folder (queue, leases, journal,
logs, reports stay where they are). The slots are the backend's own (:attr:`membership`, a
:class:`~gpuswarm.exec.ray.slots.SlotPool`): one detached actor per GPU slot of every node,
made as nodes join and retired as they die. An attempt is a :class:`~.handle.RayHandle`; the
process control on the node is the local backend's (:mod:`gpuswarm.exec.ray.actor`). What runs
on the driver itself (``after_all``) goes through the local backend. Ray is imported here only,
when a run asks for ``backend: ray`` (see docs/cluster.md).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import secrets
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuswarm.core.errors import BackendError
from gpuswarm.core.fsutil import atomic_write_bytes
from gpuswarm.core.models import EndKind
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import AttemptEnd, BackendOptions, Handle, LaunchSpec, Leftovers
from gpuswarm.exec.local.backend import LocalBackend
from gpuswarm.exec.ray import messages
from gpuswarm.exec.ray.cluster import connect, nodes, parse_filter
from gpuswarm.exec.ray.handle import RayHandle
from gpuswarm.exec.ray.settings import RayConfig
from gpuswarm.exec.ray.shapes import HeldAttempt
from gpuswarm.exec.ray.slots import SlotPool, run_actors
from gpuswarm.exec.ray.wire import pack_tree
from gpuswarm.exec.sandbox import Provision

MB = 1 << 20


class GoneHandle:
    """The attempt of a slot that is gone (its node left): ended ``lost`` before it started."""

    def __init__(self, label: str) -> None:
        now = time.time()
        reason = f"lost: slot {label} left the cluster before the attempt started"
        self._end = AttemptEnd(EndKind.LOST, None, None, reason, False, now, now, None, 0)

    pid = None
    done = True
    cancelled = False
    exit_fd = None
    deadline = None

    def end_if_clean(self) -> AttemptEnd:
        return self._end

    def wait(self) -> AttemptEnd:
        return self._end

    def cancel(self, *, hard: bool = False) -> None:
        pass

    def pids(self) -> list[int]:
        return []


def run_key_of(run_dir: str) -> str:
    """The run's name in Ray (actor names): its folder name and a hash of its path."""
    path = Path(run_dir).absolute()
    return f"{path.name}-{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


class RayBackend:
    name = "ray"
    caps_logs = False  # the driver appends what it pulls; the keeper holds each log's cap

    def __init__(self, options: BackendOptions) -> None:
        self.options = options
        settings = options.settings
        self.cfg = settings if isinstance(settings, RayConfig) else RayConfig()
        self.filter = parse_filter(options.gpus)
        self._local = LocalBackend(options)
        self._ray: Any = None
        self._pool: SlotPool | None = None
        self.probe = ""
        self._trees: dict[str, tuple[str, Any]] = {}
        self._trees_lock = threading.Lock()
        self._kept: dict[str, tuple[str, HeldAttempt]] = {}  # task -> (actor, attempt)

    # -- the cluster -----------------------------------------------------------------------------
    @property
    def ray(self) -> Any:
        if self._ray is None:
            self._ray = connect(self.cfg.address, self.cfg.namespace, self.cfg.head_timeout)
            if self.options.run_dir:  # Ray's messages: the run's ray.log, never stdout
                messages.send_to(RunPaths(Path(self.options.run_dir)).ray_log)
        return self._ray

    @property
    def membership(self) -> SlotPool | None:
        """The run's slots on the cluster (None for a backend made only to check or recover)."""
        if self._pool is None and self.options.run_dir and self.options.owner:
            self._pool = SlotPool(
                self.ray,
                self.cfg,
                run_key_of(self.options.run_dir),
                gpus_per_task=self.options.gpus_per_task,
                tasks_per_gpu=self.options.tasks_per_gpu,
                gpu_filter=self.filter,
                max_result=int(self.cfg.max_result_mb * MB),
            )
        return self._pool

    def retire(self, label: str, why: str) -> None:
        if self._pool is not None:
            self._pool.retire(label, why)

    def node_dead(self, node_id: str) -> str | None:
        """Why node ``node_id``'s attempts are lost (None: it is alive)."""
        return self._pool.node_dead(node_id) if self._pool is not None else None

    # -- the Backend protocol --------------------------------------------------------------------
    def check(self) -> None:
        """Ray is installed, the cluster answers, and some node has a GPU this run may use."""
        found = [n for n in nodes(self.ray) if self.filter.admits(n)]
        if not found:
            raise BackendError(
                f"ray.address {self.cfg.address}: the Ray cluster has no GPU node this run may "
                "use (ray status lists its resources); start the nodes with their GPUs, or "
                "loosen --gpus"
            )

    def gpu_names(self) -> list[str]:
        """The model of each GPU this run may use now (Ray's accelerator type, else "GPU"):
        ``research`` sizes its rounds by them and runs a baseline per model."""
        self.check()
        names = [
            n.accelerator for n in nodes(self.ray) if self.filter.admits(n) for _ in range(n.gpus)
        ]
        return names[: self.filter.count] if self.filter.count is not None else names

    def open(self) -> None:
        self._local.open()
        if self.options.run_dir and not self.probe:
            self.probe = secrets.token_hex(16)
            probe = RunPaths(Path(self.options.run_dir)).ray_probe
            atomic_write_bytes(probe, self.probe.encode(), mode=0o600)

    def prepare_slot(self, home: Path | None, provisions: Sequence[Provision]) -> dict[str, str]:
        return self._local.prepare_slot(home, provisions)

    def launch(self, spec: LaunchSpec) -> Handle:
        label = spec.identity.get("slot", "")
        if not label or self._pool is None:  # after_all: on the driver
            return self._local.launch(spec)
        rs = self._pool.get(label)
        if rs is None:  # its node left between the claim and the launch: never on the driver
            return GoneHandle(label)
        if not self.probe:
            self.open()
        return RayHandle(self, rs, spec)

    def tree_for(self, spec: LaunchSpec) -> tuple[str, Any]:
        """The attempt's cwd packed for a node that does not see it (once per folder per run:
        its key and the object in Ray's store). TooLarge past ray.max_ship_mb."""
        cwd = str(spec.cwd)
        with self._trees_lock:
            if cwd not in self._trees:
                key, blob = pack_tree(Path(cwd), int(self.cfg.max_ship_mb * MB))
                self._trees[cwd] = (key, self.ray.put(blob))
            return self._trees[cwd]

    def home_for(self, home: Path) -> bytes:
        """A slot's private HOME packed for a node that does not see the run folder (its
        provisioned files; TooLarge past ray.max_ship_mb)."""
        return pack_tree(home, int(self.cfg.max_ship_mb * MB))[1]

    def end_leftovers(
        self, *, run_dir: str | None = None, owner: str | None = None, grace: float = 10.0
    ) -> Leftovers:
        """A dead driver's attempts. Resuming this run (a backend with an owner): each attempt
        a live slot actor holds is kept, running or ended, for the new driver to wait for or
        collect (:meth:`kept_attempts`); else (``check --repair``) every one is ended (TERM,
        grace, KILL) and the run's actors killed. (Another supervisor's, ``owner``: a Ray run
        has one driver.)"""
        if run_dir is None:
            return self._local.end_leftovers(owner=owner, grace=grace)
        mine = Path(self.options.run_dir or ".").absolute()
        keep = bool(self.options.owner) and Path(run_dir).absolute() == mine
        # on the driver's host: what ran there (after_all); not when resuming, where a node on
        # this host may run the attempts we keep (they carry the run's folder too)
        local = Leftovers([], frozenset(), 0)
        if not keep:
            local = self._local.end_leftovers(run_dir=run_dir, grace=grace)
        ray = self.ray
        found = run_actors(ray, run_key_of(run_dir), self.cfg.namespace)
        tasks: set[str] = set(local.tasks)
        killed = local.killed
        names: list[int | str] = list(local.ids)
        for name, actor in found:
            try:
                held = ray.get(actor.attempts.remote(), timeout=30)
            except Exception:  # its node is gone: what it ran is lost
                held = []
            if keep and held:
                self._keep(name, held)
                continue
            for item in held:
                if not item["ended"] and item["identity"].get("task"):
                    tasks.add(str(item["identity"]["task"]))
            stopped = 0
            with contextlib.suppress(Exception):
                stopped = int(ray.get(actor.stop_all.remote(grace), timeout=grace + 60))
            killed += stopped
            if not keep:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
            if stopped or not keep:
                names.append(name)
        if self._kept and self.membership is not None:
            self.membership.adopt(self._kept, self)
        return Leftovers(names, frozenset(tasks), killed)

    def _keep(self, name: str, held: list[HeldAttempt]) -> None:
        for item in held:
            task = str(item["identity"].get("task") or "")
            if task and item["identity"].get("kind", "attempt") == "attempt":
                self._kept[task] = (name, item)

    def kept_attempts(self) -> frozenset[str]:
        """Tasks whose attempt a slot actor still holds (recovery leaves them running)."""
        return frozenset(self._kept)

    def leftovers(self, run_dir: str) -> list[int | str]:
        """The run's actors Ray still has (``gpuswarm check``); none when the cluster is gone
        (a head that died took them with it)."""
        try:
            found = run_actors(self.ray, run_key_of(run_dir), self.cfg.namespace)
        except BackendError:
            found = []
        return [*self._local.leftovers(run_dir), *(name for name, _ in found)]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self._local.close()
        if self.options.run_dir:
            with contextlib.suppress(OSError):
                RunPaths(Path(self.options.run_dir)).ray_probe.unlink()
        lost = self._pool is not None and self._pool.lost is not None
        if self._ray is not None and lost:
            # a head that is gone: nothing to leave, and Ray's own leaving (its exit hook)
            # waits for it for half a minute before the process may end
            atexit.unregister(self._ray.shutdown)
        elif self._ray is not None:
            with contextlib.suppress(Exception):
                self._ray.shutdown()
            self._ray = None
