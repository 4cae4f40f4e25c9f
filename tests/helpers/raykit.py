"""A real multi-node Ray cluster on one machine for the ``ray`` backend's tests.

``ray.cluster_utils.Cluster`` starts a separate raylet per node; each node gets fake GPU
resources (``num_gpus=2``: Ray assigns GPU ids and sets each actor's ``CUDA_VISIBLE_DEVICES``
as on real GPUs), ``RAY_TMPDIR`` is a short temp folder of the test's own (removed with the
cluster: under pytest-xdist the test's temp path is so long that Ray's socket paths under it
pass AF_UNIX's 107 bytes and the head never starts), and the health check is fast
(as Ray's own node-death tests set it) so a removed node is declared dead within about a second.

:func:`require_ray` skips a test without Ray locally, and fails it instead in CI
(``CI=true``) or under ``GPUSWARM_REQUIRE_RAY=1``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

REQUIRE_ENV = "GPUSWARM_REQUIRE_RAY"
# Ray's node-death tests: a node is dead after failure_threshold missed checks of period_ms
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 5,
}
NODE_ARGS: dict[str, Any] = {"num_cpus": 2, "num_gpus": 2, "object_store_memory": 80 << 20}


def ray_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI", "").lower() == "true"


def require_ray() -> None:
    if importlib.util.find_spec("ray") is None:
        why = "Ray is not installed (pip install 'gpuswarm[ray]')"
        if ray_required():
            pytest.fail(f"{why}, and CI / {REQUIRE_ENV}=1 asks for it", pytrace=False)
        pytest.skip(why)


class LocalRayCluster:
    """A head and ``nodes - 1`` workers, each with 2 fake GPUs; the test process connects."""

    def __init__(self, tmp: Path, nodes: int = 3, *, connect: bool = True) -> None:
        """``connect=False``: the test process stays out of it (a test that kills the head:
        Ray ends every driver of a head that is gone, the pytest worker too)."""
        import ray as ray_module
        from ray.cluster_utils import Cluster

        self.tmp = tmp
        # <RAY_TMPDIR>/ray/session_<date>_<pid>/sockets/plasma_store must stay under 107 bytes
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="gsray-"))
        os.environ["RAY_TMPDIR"] = str(self.ray_tmp)
        os.environ["GPUSWARM_RAY_SCRATCH"] = str(tmp / "scratch")  # the actors' node folders
        ray: Any = ray_module
        self.cluster: Any = Cluster(
            initialize_head=True,
            head_node_args={**NODE_ARGS, "_system_config": FAST_HEALTH, "include_dashboard": False},
        )
        self.workers = [self.cluster.add_node(**NODE_ARGS) for _ in range(nodes - 1)]
        self.cluster.wait_for_nodes()
        self.address: str = self.cluster.address
        self.connected = connect
        if connect:
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR)
        self.ray = ray

    def kill_head(self) -> None:
        """The head dies at once (its GCS and raylet SIGKILLed), and every Ray process it
        left behind with it (the agents Ray does not take down), as a crashed machine."""
        self.cluster.remove_node(self.cluster.head_node, allow_graceful=False)
        kill_processes_under(self.ray_tmp)

    def add_node(self) -> Any:
        node = self.cluster.add_node(**NODE_ARGS)
        self.workers.append(node)
        return node

    def remove_node(self, node: Any) -> None:
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)

    def node_ids(self) -> set[str]:
        return {str(n["NodeID"]) for n in self.ray.nodes() if n["Alive"]}

    def worker_for(self, node_id_prefix: str) -> Any:
        """The worker node whose id starts with ``node_id_prefix`` (slot labels carry 6 chars)."""
        for node in self.workers:
            if node.node_id.startswith(node_id_prefix):
                return node
        return None

    def named_actors(self) -> list[str]:
        from ray.util import list_named_actors

        return [
            a["name"] if isinstance(a, dict) else str(a)
            for a in list_named_actors(all_namespaces=True)
        ]

    def wait_no_actors(self, prefix: str = "gpuswarm/", timeout: float = 15.0) -> list[str]:
        """The run's named actors left after ``timeout`` ([] once every one is gone)."""
        deadline = time.monotonic() + timeout
        while True:
            left = [n for n in self.named_actors() if n.startswith(prefix)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def shutdown(self) -> None:
        if self.connected:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
        with contextlib.suppress(Exception):
            self.cluster.shutdown()
        kill_processes_under(self.ray_tmp)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        os.environ.pop("RAY_TMPDIR", None)
        os.environ.pop("GPUSWARM_RAY_SCRATCH", None)


def kill_processes_under(folder: Path) -> int:
    """SIGKILL every process whose command line names ``folder`` (a node's session: its
    raylet, agents, workers); how many there were."""
    import psutil

    mark = str(folder)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(mark in part for part in proc.info["cmdline"] or ()):
                proc.kill()
                found.append(proc)
    psutil.wait_procs(found, timeout=5)
    return len(found)
