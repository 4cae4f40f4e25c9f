"""The run's slot actors across the cluster, and its membership: nodes join, nodes die.

One detached actor per slot, named ``<run>/<node id>/<k>`` in the run's namespace (so a
resumed driver finds them again), pinned to its node (``NodeAffinitySchedulingStrategy``, hard),
asking Ray for ``gpus_per_task`` GPUs, or ``1/tasks_per_gpu`` of one: Ray sets each actor's
``CUDA_VISIBLE_DEVICES``, and the slot's GPUs are what it reports (``ray.get_gpu_ids()``).
A watcher thread lists the nodes every half second: a node that joins gets its slots (actors
made, asked who they are, the per-node ``setup:`` run once), a node Ray declares dead retires
its slots; the slot loop picks both up through :meth:`SlotPool.changes`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuswarm.core.paths import slugify
from gpuswarm.exec.base import Adopted, LaunchSpec, SlotChanges
from gpuswarm.exec.ray import cluster, nodeactors
from gpuswarm.exec.ray.actor import SlotActor
from gpuswarm.exec.ray.cluster import GpuFilter, Node, alive_ids, nodes
from gpuswarm.exec.ray.cluster import head_address as head_address
from gpuswarm.exec.ray.cluster import run_actors as run_actors
from gpuswarm.exec.ray.handle import RayHandle
from gpuswarm.exec.ray.settings import RayConfig
from gpuswarm.exec.ray.shapes import ActorInfo, HeldAttempt
from gpuswarm.placement.devices import Gpu, Vendor
from gpuswarm.placement.gpus import Slot

WATCH_SECONDS = 0.5
HEAD_PROBE_SECONDS = 1.0  # a TCP connect to the head's GCS port, at most this long, each second


@dataclass
class RaySlot:
    slot: Slot
    node: Node
    actor: Any  # the actor handle
    name: str


class SlotPool:
    """The slots of one run on the cluster (the Membership of :class:`.backend.RayBackend`)."""

    def __init__(
        self,
        ray: Any,
        cfg: RayConfig,
        run_key: str,
        *,
        gpus_per_task: int,
        tasks_per_gpu: int,
        gpu_filter: GpuFilter,
        max_result: int,
    ) -> None:
        self.ray = ray
        self.cfg = cfg
        self.run_key = run_key
        self.per_task = gpus_per_task
        self.per_gpu = tasks_per_gpu
        self.filter = gpu_filter
        self.max_result = max_result
        self.lock = threading.Lock()
        self.by_label: dict[str, RaySlot] = {}
        self.nodes: dict[str, Node] = {}  # node id -> node with slots of ours
        self.dead: dict[str, str] = {}  # node id -> why its attempts are lost
        self.lost: str | None = None  # the head is gone: why (the run must stop)
        self.labels_of: dict[str, list[str]] = {}  # node id -> every slot it had
        self._next_index = 0
        self._gpus_used = 0
        self._pending = SlotChanges()
        self._wakeup: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._head_thread: threading.Thread | None = None
        self._cls: Any = None
        self._kept: dict[str, tuple[str, HeldAttempt]] = {}
        self._backend: Any = None

    # -- the Membership protocol -----------------------------------------------------------------
    def initial_slots(self) -> list[Slot]:
        found = self._add_nodes()
        with self.lock:  # what initial_slots returns is not a change
            self._pending.added.clear()
            self._pending.notes.clear()
            kept, self._kept = self._kept, {}
        for task, (name, item) in kept.items():
            rs = next((r for r in self.all() if r.name == name), None)
            if rs is None:
                continue  # its node is not used now: lost (recovery re-runs the task)
            spec = LaunchSpec(
                argv=[],
                env={"GPUSWARM_TASK_WORKSPACE": str(item.get("workspace") or "")},
                cwd=Path(),
                log_path=Path(str(item["log"])),
                token=str(item["token"]),
                identity=dict(item["identity"]),
            )
            attempt = int(item["identity"].get("attempt") or 0)
            handle = RayHandle(self._backend, rs, spec, adopted=True)
            with self.lock:
                self._pending.adopted.append(Adopted(task, attempt, rs.slot, handle))
        return found

    def adopt(self, kept: dict[str, tuple[str, HeldAttempt]], backend: Any) -> None:
        """Attempts a dead driver's actors hold: offered to the loop with the first slots."""
        self._kept = dict(kept)
        self._backend = backend

    def watch(self, wakeup: Callable[[], None]) -> None:
        self._wakeup = wakeup
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="ray-nodes", daemon=True)
            self._thread.start()
        head = head_address(self.ray, self.cfg.address)
        if self._head_thread is None and head is not None:
            self._head_thread = threading.Thread(
                target=self._watch_head, args=(head,), name="ray-head", daemon=True
            )
            self._head_thread.start()

    def changes(self) -> SlotChanges:
        with self.lock:
            out, self._pending = self._pending, SlotChanges()
        return out

    # -- queries ---------------------------------------------------------------------------------
    def get(self, label: str) -> RaySlot | None:
        with self.lock:
            return self.by_label.get(label)

    def may_grow(self) -> bool:
        """Whether a node joining would give the run slots again: the head is there and no
        node of the run's is alive (all of them left). Not when a live node's actors died:
        that node gets no new ones."""
        with self.lock:
            return self.lost is None and not self.nodes

    def node_dead(self, node_id: str) -> str | None:
        """Why the attempts of node ``node_id`` are lost (Ray declared it dead, or the head is
        gone); None while it is alive."""
        with self.lock:
            return self.dead.get(node_id)

    def all(self) -> list[RaySlot]:
        with self.lock:
            return list(self.by_label.values())

    # -- making slots ----------------------------------------------------------------------------
    def _actor_class(self) -> Any:
        if self._cls is None:
            self._cls = self.ray.remote(SlotActor)
        return self._cls

    def _slots_of(self, node: Node) -> int:
        groups = node.gpus // self.per_task
        if self.filter.count is not None:
            left = max(0, self.filter.count - self._gpus_used)
            groups = min(groups, left // self.per_task)
        return groups * self.per_gpu

    def _add_nodes(self) -> list[Slot]:
        """Make slots on every admitted node that has none yet; the slots made."""
        made: list[Slot] = []
        for node in nodes(self.ray):
            with self.lock:
                known = node.node_id in self.nodes or node.node_id in self.dead
            if known or not self.filter.admits(node):
                continue
            made.extend(self._add_node(node))
        return made

    def _add_node(self, node: Node) -> list[Slot]:
        count = self._slots_of(node)
        if count == 0:  # (--gpus N reached): looked at again when a node's GPUs come free
            return []
        self._gpus_used += (count // self.per_gpu) * self.per_task
        num_gpus = self.per_task if self.per_gpu == 1 else 1.0 / self.per_gpu
        actors = nodeactors.start_actors(
            self._actor_class(),
            self.cfg,
            self.run_key,
            node,
            count,
            num_gpus=num_gpus,
            max_result=self.max_result,
        )
        infos = nodeactors.ready(self.ray, [actor for _, actor in actors])
        if self.cfg.setup and (
            failed := nodeactors.run_setup(self.ray, self.cfg, node, actors, infos)
        ):
            with self.lock:
                self._pending.notes.append(failed)
        made = []
        shares: dict[tuple[int, ...], int] = {}
        with self.lock:
            self.nodes[node.node_id] = node
            for (name, actor), info in zip(actors, infos, strict=True):
                if info is None:
                    with contextlib.suppress(Exception):
                        self.ray.kill(actor)
                    continue
                gpu_ids = tuple(int(g) for g in info["gpus"]) or (0,)
                share = shares.get(gpu_ids, 0)
                shares[gpu_ids] = share + 1
                slot = slot_of(self._next_index, node, info, gpu_ids, share)
                self._next_index += 1
                self.by_label[slot.label] = RaySlot(slot, node, actor, name)
                self.labels_of.setdefault(node.node_id, []).append(slot.label)
                made.append(slot)
            self._pending.added.extend(made)
            if made:
                self._pending.notes.append(
                    {
                        "change": "joined",
                        "node": node.node_id,
                        "host": node.host,
                        "accelerator": node.accelerator,
                        "slots": [s.label for s in made],
                    }
                )
        return made

    # -- watching --------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            if self.lost is not None:
                return
            try:
                changed = self._look()
            except Exception:  # the head is unreachable for a moment: look again
                continue
            if changed and self._wakeup is not None:
                self._wakeup()

    def _look(self) -> bool:
        alive = alive_ids(self.ray)
        retired: list[str] = []
        with self.lock:
            if self.lost is not None:
                return False
            gone = [n for n in self.nodes if n not in alive and n not in self.dead]
            for node_id in gone:
                self.dead[node_id] = "Ray declared its node dead"
                node = self.nodes.pop(node_id)
                labels = self.labels_of.get(node_id, [])
                for label in labels:
                    if self.by_label.pop(label, None) is not None:
                        retired.append(label)
                self._gpus_used -= (len(labels) // self.per_gpu) * self.per_task
                if labels:
                    self._pending.notes.append(
                        {"change": "left", "node": node_id, "host": node.host, "slots": labels}
                    )
            self._pending.retired.extend(retired)
        added = self._add_nodes()
        return bool(gone or added)  # a node gone: its `left` is news even with no slot left

    def _watch_head(self, head: tuple[str, int]) -> None:
        """The head's GCS port, probed each second on a thread of its own (a call into Ray
        blocks while the head is gone): not answering for ``ray.head_timeout``, the head is
        lost: every slot goes, every node's attempts are lost, and the run stops (``fatal``)."""
        down_since: float | None = None
        while not self._stop.wait(HEAD_PROBE_SECONDS if down_since is None else 0.25):
            if cluster.answers(head, HEAD_PROBE_SECONDS):
                down_since = None
                continue
            now = time.monotonic()
            down_since = now if down_since is None else down_since
            if now - down_since >= self.cfg.head_timeout:
                self._head_lost(head, now - down_since)
                return

    def _head_lost(self, head: tuple[str, int], after: float) -> None:
        where = f"{head[0]}:{head[1]}"
        why = (
            f"the Ray head at {where} stopped answering ({after:.0f} s, ray.head_timeout): "
            "every attempt in flight is lost and back in the queue; start the cluster again "
            "and run `gpuswarm resume RUN --ray-address HEAD:PORT` (the new head's address)"
        )
        with self.lock:
            self.lost = why
            labels = list(self.by_label)
            for node_id in [*self.nodes, *(rs.node.node_id for rs in self.by_label.values())]:
                self.dead.setdefault(node_id, f"the Ray head at {where} is gone")
            self.by_label.clear()
            self.nodes.clear()
            self._pending.retired.extend(labels)
            self._pending.notes.append({"change": "left", "node": None, "slots": labels})
            self._pending.fatal = why
        if self._wakeup is not None:
            self._wakeup()

    def retire(self, label: str, why: str) -> None:
        """Take a slot out now (its actor died: it would fail every attempt until the node is
        declared dead); the loop drops it from its free slots at its next pass."""
        with self.lock:
            rs = self.by_label.pop(label, None)
            if rs is None:
                return
            self._pending.retired.append(label)
            self._pending.notes.append(
                {
                    "change": "retired",
                    "node": rs.node.node_id,
                    "host": rs.node.host,
                    "slots": [label],
                    "reason": why,
                }
            )
        if self._wakeup is not None:
            self._wakeup()

    def close(self) -> None:
        """Stop watching and kill every actor of the run (nothing of it remains; with the head
        gone, Ray took them with it, and a call into it would block)."""
        self._stop.set()
        if self.lost is not None:
            return
        if self._thread is not None:
            self._thread.join(5)
        slots = self.all()
        firsts = {rs.node.node_id: rs for rs in slots}  # one per node: the scratch is the node's
        refs = [rs.actor.cleanup.remote() for rs in firsts.values()]
        with contextlib.suppress(Exception):
            self.ray.wait(refs, num_returns=len(refs), timeout=10)
        for rs in slots:
            with contextlib.suppress(Exception):
                self.ray.kill(rs.actor, no_restart=True)
        cluster.kill_run_actors(self.ray, self.run_key, self.cfg.namespace)


def slot_of(index: int, node: Node, info: ActorInfo, gpu_ids: tuple[int, ...], share: int) -> Slot:
    """Slot ``index`` of the run: the GPUs ``gpu_ids`` an actor on ``node`` reported (``info``),
    its ``share``-th on them."""
    return Slot(
        index,
        gpu_ids,
        Vendor.NVIDIA,
        share,
        ident=slot_label(str(info["host"]), node.node_id, gpu_ids, share),
        devices=tuple(Gpu(i, node.accelerator, Vendor.NVIDIA) for i in gpu_ids),
        host=slugify(str(info["host"]), 60),
    )


def slot_label(host: str, node_id: str, gpu_ids: tuple[int, ...], share: int) -> str:
    """``<host>-<node id prefix>-gpu0`` (several nodes may share a host name: containers,
    one machine's test cluster); ``.1`` for the second slot on that GPU."""
    base = f"{slugify(host, 40)}-{node_id[:6]}-gpu" + "+".join(str(i) for i in gpu_ids)
    return f"{base}.{share}" if share else base
