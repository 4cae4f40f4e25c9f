"""A node's slot actors brought up: made pinned to it, waited for until each says where it
runs (its host, its GPUs), and the per-node ``setup:`` run once on the first of them.

The slot pool (``slots.py``) decides how many a node gets and turns what they answer into
slots; this module is the talking to Ray in between.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpuswarm.exec.ray import cluster
from gpuswarm.exec.ray.cluster import Node
from gpuswarm.exec.ray.settings import RayConfig
from gpuswarm.exec.ray.shapes import ActorInfo, SetupReply

READY_TIMEOUT = 60.0  # a node's actors not up by then (its GPUs are another run's): no slot
ACTOR_THREADS = 8  # start, poll, cancel, forget of one slot may overlap


def start_actors(
    cls: Any,
    cfg: RayConfig,
    run_key: str,
    node: Node,
    count: int,
    *,
    num_gpus: float,
    max_result: int,
) -> list[tuple[str, Any]]:
    """``count`` detached actors of ``cls`` on ``node`` (name, handle), named
    ``<run>/<node id>/<k>`` so a resumed driver finds the same ones (``get_if_exists``)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    actors = []
    for k in range(count):
        name = f"{cluster.actor_prefix(run_key)}{node.node_id}/{k}"
        actor = cls.options(
            name=name,
            namespace=cfg.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            num_gpus=num_gpus,
            max_concurrency=ACTOR_THREADS,
            max_restarts=0,
            scheduling_strategy=strategy,
        ).remote(run_key, max_result)
        actors.append((name, actor))
    return actors


def ready(ray: Any, actors: list[Any]) -> list[ActorInfo | None]:
    """Each actor's info once up (all waited for together); None: not up in READY_TIMEOUT."""
    refs = [actor.info.remote() for actor in actors]
    with contextlib.suppress(Exception):
        ray.wait(refs, num_returns=len(refs), timeout=READY_TIMEOUT)
    out: list[ActorInfo | None] = []
    for ref in refs:
        try:
            out.append(ray.get(ref, timeout=0.1))
        except Exception:
            out.append(None)
    return out


def run_setup(
    ray: Any,
    cfg: RayConfig,
    node: Node,
    actors: list[tuple[str, Any]],
    infos: list[ActorInfo | None],
) -> dict[str, object] | None:
    """The per-node ``setup:`` once, on the node's first actor that is up, before its first
    attempt. A failure: every entry of ``infos`` becomes None (the node gets no slots) and the
    journal's ``setup_failed`` note says why; None when it passed or no actor is up."""
    assert cfg.setup is not None
    first = next((a for (_, a), i in zip(actors, infos, strict=True) if i is not None), None)
    if first is None:
        return None
    try:
        result: SetupReply = ray.get(
            first.setup.remote(cfg.setup, node.node_id, cfg.setup_timeout),
            timeout=cfg.setup_timeout + 60,
        )
    except Exception as exc:
        result = {"rc": -1, "tail": str(exc), "ran": True}
    if result.get("rc") == 0:
        return None
    for i in range(len(infos)):
        infos[i] = None
    return {
        "change": "setup_failed",
        "node": node.node_id,
        "host": node.host,
        "rc": result.get("rc"),
        "tail": str(result.get("tail", ""))[-2000:],
    }
