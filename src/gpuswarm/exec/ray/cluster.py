"""The Ray cluster as the driver sees it: connecting, its nodes, and ``--gpus`` under Ray.

``--gpus`` (or the config's ``gpus:``) under ``backend: ray`` filters the cluster's GPUs instead
of naming host ids: ``auto``/``all`` (default) every GPU of every node, now and joining later;
``N`` at most N GPUs in all; ``node:A,B`` nodes by host name, IP or node-id prefix (6 or
more characters, as slot labels show it);
``label:K=V`` nodes carrying a Ray label (``ray start --labels``) or a custom resource ``K``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuswarm.core.errors import BackendError, GpuSpecError
from gpuswarm.exec.ray import messages

INSTALL_HINT = "install it with: pip install 'gpuswarm[ray]' (on the driver and every node)"
SPEC_FORMS = (
    "use auto (every GPU of the cluster), a count (8), node:HOST[,HOST], or label:KEY=VALUE"
)


def import_ray() -> Any:
    """The ``ray`` module; BackendError (exit 2) with the install line when it is missing."""
    try:
        import ray
    except ImportError:
        raise BackendError(
            f"backend: ray needs Ray, which is not installed; {INSTALL_HINT}"
        ) from None
    return ray


def connect(address: str, namespace: str, head_timeout: float = 30.0) -> Any:
    """Join the cluster at ``address`` as its driver (idempotent in a process). Ray ends a
    driver whose head is gone for ``gcs_rpc_server_reconnect_timeout_s``: kept well past
    ``head_timeout``, so that the driver notices first and stops the run itself."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    _reachable(address)
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    reconnect = max(60, int(head_timeout) + 30)
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(reconnect))
    # what Ray prints to its driver (the cluster's messages, the actors' own output): the run's
    # ray.log, never stdout; where this Ray has no printer to replace, the actors' output stays
    # in Ray's session logs on their nodes
    forwarded = messages.install(ray)
    try:
        ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=forwarded,
            logging_level="ERROR",
            configure_logging=True,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BackendError(
            f"ray.address {address}: cannot join the Ray cluster ({str(exc).splitlines()[0]}); "
            "start one (`ray start --head` on the head, `ray start --address HEAD:6379` on the "
            "others) or give its address with --ray-address HOST:PORT"
        ) from None
    return ray


def _reachable(address: str, timeout: float = 3.0) -> None:
    """A HOST:PORT that accepts no connection fails now, not after Ray's minutes of retries
    (a head that is gone: ``check`` and ``resume`` say so at once)."""
    if address == "auto":
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        raise BackendError(
            f"ray.address {address}: nothing answers there ({exc}); start the cluster "
            "(`ray start --head`) or give its address with --ray-address HOST:PORT"
        ) from None


@dataclass(frozen=True)
class Node:
    node_id: str
    host: str
    ip: str
    gpus: int
    accelerator: str  # Ray's accelerator_type resource ("H100"), else "GPU"
    labels: Mapping[str, str]
    resources: Mapping[str, float]


def nodes(ray: Any) -> list[Node]:
    """The alive nodes with at least one GPU, in the order Ray lists them."""
    out = []
    for raw in ray.nodes():
        if not raw.get("Alive"):
            continue
        res = raw.get("Resources") or {}
        gpus = int(res.get("GPU", 0))
        if gpus < 1:
            continue
        accel = next((k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")), "GPU")
        out.append(
            Node(
                node_id=str(raw["NodeID"]),
                host=str(raw.get("NodeManagerHostname") or raw.get("NodeManagerAddress") or "?"),
                ip=str(raw.get("NodeManagerAddress") or ""),
                gpus=gpus,
                accelerator=accel,
                labels=dict(raw.get("Labels") or {}),
                resources=dict(res),
            )
        )
    return out


def alive_ids(ray: Any) -> set[str]:
    return {str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}


@dataclass(frozen=True)
class GpuFilter:
    """Which of the cluster's GPUs a run uses (see the module docstring)."""

    count: int | None = None  # at most this many GPUs in all
    hosts: tuple[str, ...] = ()
    label: tuple[str, str] | None = None

    def admits(self, node: Node) -> bool:
        if self.hosts and not any(
            h in (node.host, node.ip) or (len(h) >= 6 and node.node_id.startswith(h))
            for h in self.hosts
        ):
            return False
        if self.label is not None:
            key, value = self.label
            if node.labels.get(key) != value and not (value == "" and key in node.resources):
                return False
        return True


def parse_filter(spec: str | None) -> GpuFilter:
    text = (spec or "auto").strip()
    low = text.lower()
    if low in ("auto", "all", ""):
        return GpuFilter()
    if text.isdigit():
        if int(text) < 1:
            raise GpuSpecError(f"--gpus {text}: under backend: ray a count must be at least 1")
        return GpuFilter(count=int(text))
    if low.startswith("node:"):
        hosts = tuple(h.strip() for h in text[5:].split(",") if h.strip())
        if not hosts:
            raise GpuSpecError(f"--gpus {text}: name at least one node; {SPEC_FORMS}")
        return GpuFilter(hosts=hosts)
    if low.startswith("label:"):
        key, _, value = text[6:].partition("=")
        if not key.strip():
            raise GpuSpecError(f"--gpus {text}: write label:KEY=VALUE; {SPEC_FORMS}")
        return GpuFilter(label=(key.strip(), value.strip()))
    raise GpuSpecError(f"--gpus {text!r} under backend: ray; {SPEC_FORMS}")


# -- a run's actors and the head -----------------------------------------------------------------
def actor_prefix(run_key: str) -> str:
    return f"gpuswarm/{run_key}/"


def run_actors(ray: Any, run_key: str, namespace: str) -> list[tuple[str, Any]]:
    """The named actors of run ``run_key`` that Ray still knows (any node)."""
    from ray.util import list_named_actors

    prefix = actor_prefix(run_key)
    out = []
    for entry in list_named_actors(all_namespaces=True):
        name = entry["name"] if isinstance(entry, dict) else str(entry)
        ns = entry.get("namespace") if isinstance(entry, dict) else namespace
        if not name.startswith(prefix) or ns != namespace:
            continue
        with contextlib.suppress(Exception):
            out.append((name, ray.get_actor(name, namespace=namespace)))
    return out


def kill_run_actors(ray: Any, run_key: str, namespace: str) -> int:
    found = run_actors(ray, run_key, namespace)
    for _, actor in found:
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    return len(found)


def head_address(ray: Any, configured: str) -> tuple[str, int] | None:
    """What the driver probes for the head: the Ray Client server of a ``ray://`` address (the
    GCS behind it may be out of the driver's reach), else the head's GCS host and port; None
    where it cannot tell (the head's health is then Ray's alone)."""
    text = configured.removeprefix("ray://") if configured.startswith("ray://") else ""
    if not text:
        with contextlib.suppress(Exception):
            text = str(ray.get_runtime_context().gcs_address or "")
    if not text and configured != "auto":
        text = configured
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def answers(head: tuple[str, int], timeout: float) -> bool:
    """Whether the head's port takes a TCP connection within ``timeout`` seconds."""
    try:
        socket.create_connection(head, timeout=timeout).close()
    except OSError:
        return False
    return True
