"""Two Ray nodes that are really two hosts to each other, on one machine: network namespaces.

The head runs in the root namespace on the root end of a veth pair (``10.213.N.1/30``, N free
and picked under a lock); node B runs in a network namespace of its own on the other end
(``10.213.N.2``), in a UTS namespace of its own too (``unshare -u``: its host name is
:data:`NODE_HOSTNAME`), so Ray, the slot actors and gpuswarm see another host, at another
address, with its own ports (the head's are free ones: another Ray of the machine is left
alone). :meth:`NetnsCluster.cut` partitions them (every packet over the link dropped, or the
link down) and :meth:`NetnsCluster.restore` heals it: node B's processes go on running, cut off;
the head's fast health check (raykit's ``FAST_HEALTH``) declares the node dead within about a
second, and node B's raylet gives up on the head after :data:`NODE_RECONNECT_S` (gRPC
keepalives of a second let it see a silent head at all).

Everything of one cluster carries its tag ``gsnn<pid>x<k>`` (the namespace's and links' names,
``GPUSWARM_NETNS_TAG`` in the environment of every process of both nodes, the temp folder in
Ray's command lines), so :meth:`NetnsCluster.close` ends exactly its own processes (never
``ray stop``: that ends every Ray of the machine), deletes the namespace and link and removes its
temp folder, whatever state the test left them in.

Nothing here joins the cluster from the test process (Ray's C++ ends a driver whose head goes):
:meth:`NetnsCluster.query` asks from a short-lived subprocess.

:func:`require_netns` skips a test that cannot make namespaces (not root, no ``ip``/``nft``);
in CI (``CI=true``) or under ``GPUSWARM_REQUIRE_RAY=1`` a missing tool or a failing
``ip netns add`` as root fails it instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from cli_driver import env_processes, kill_processes
from raykit import FAST_HEALTH, ray_required

TAG_ENV = "GPUSWARM_NETNS_TAG"
NODE_HOSTNAME = "gs-node-b"
NODE_RECONNECT_S = 5  # node B's raylet gives up on an unreachable head after this
GPUS_PER_NODE = 2
SUBNET = "10.213"  # SUBNET.N.1 the head, SUBNET.N.2 node B
_LOCK = Path(tempfile.gettempdir()) / "gpuswarm-netns.lock"
_made = itertools.count()
# node B's processes: a raylet whose head went silent (packets dropped, no connection closed)
# learns it from gRPC keepalives within about 2 s, then gives up after NODE_RECONNECT_S
# (measured here: gone about 9 s after the cut; with Ray's defaults it ran on for 183 s, and its
# slot actors with it, so their attempts too, guard or not)
NODE_ENV = {
    "RAY_gcs_rpc_server_reconnect_timeout_s": str(NODE_RECONNECT_S),
    "RAY_grpc_client_keepalive_time_ms": "1000",
    "RAY_grpc_client_keepalive_timeout_ms": "1000",
}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def require_netns() -> None:
    """Skip without root, ``ip netns`` or ``nft`` (fail instead where CI asks for the Ray
    tests: as root, a missing tool is the machine's fault, not a reason to pass)."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns, veth, unshare -u)")
    why = None
    missing = [t for t in ("ip", "unshare", "nft") if shutil.which(t) is None]
    if missing:
        why = f"{', '.join(missing)} not installed (iproute2, util-linux, nftables)"
    else:
        probe = f"gsnn-probe-{os.getpid()}"
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            why = f"`ip netns add` fails here: {made.stderr.strip()}"
        else:
            _ip("netns", "delete", probe, check=False)
    if why is not None:
        if ray_required():
            pytest.fail(f"{why}, and CI / GPUSWARM_REQUIRE_RAY=1 asks for it", pytrace=False)
        pytest.skip(why)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _free_subnet() -> int:
    """N of a ``SUBNET.N.0/30`` no address of the root namespace is in (from the pid's on)."""
    shown = _ip("-o", "-4", "addr", "show").stdout
    used = {int(m) for m in re.findall(rf"inet {re.escape(SUBNET)}\.(\d+)\.", shown)}
    start = os.getpid() % 250
    for k in range(250):
        n = (start + k) % 250 + 1
        if n not in used:
            return n
    raise AssertionError(f"every {SUBNET}.N.0/30 is in use: {sorted(used)}")


def sweep_stale() -> int:
    """Remove what a test process that was killed outright left (its pid is gone): the
    namespaces and links named after it, every process they hold or tagged by it, its temp
    folders. How many namespaces it removed."""
    names = _ip("netns", "list", check=False).stdout.split()
    stale = {
        m.group(1)
        for name in names
        if (m := re.fullmatch(r"(gsnn(\d+)x\d)-b", name)) and not psutil.pid_exists(int(m[2]))
    }
    for tag in stale:
        pids = _ip("netns", "pids", f"{tag}-b", check=False).stdout.split()
        procs = env_processes(TAG_ENV, tag)
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(int(pid)))
        kill_processes(procs)
        _ip("link", "delete", f"{tag}r", check=False)
        _ip("netns", "delete", f"{tag}-b", check=False)
        for folder in Path(tempfile.gettempdir()).glob(f"{tag}-*"):
            shutil.rmtree(folder, ignore_errors=True)
    return len(stale)


def _ray_bin() -> str:
    found = Path(sys.executable).parent / "ray"
    return str(found) if found.exists() else "ray"


class NetnsCluster:
    """A Ray head here and node B in namespace :attr:`ns`, each with 2 fake GPUs."""

    def __init__(self, scratch: Path) -> None:
        # <= 15 characters with a suffix: the kernel's limit for a link's name
        self.tag = f"gsnn{os.getpid()}x{next(_made) % 10}"
        self.ns = f"{self.tag}-b"
        self.veth_root = f"{self.tag}r"
        self.veth_node = f"{self.tag}b"
        self.head_ip = self.node_ip = ""  # the /30 is chosen when the link is made
        self.hostname = NODE_HOSTNAME
        self.scratch = scratch  # the actors' node folders (GPUSWARM_RAY_SCRATCH)
        # <temp>/session_<date>_<pid>/sockets/plasma_store must stay under AF_UNIX's 107 bytes
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.port = 0
        self.head: subprocess.Popen[bytes] | None = None
        self.node: subprocess.Popen[bytes] | None = None
        self.cut_how: str | None = None

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    # -- topology -------------------------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> None:
        """The namespace and link, the head, node B; back once Ray lists both nodes alive."""
        self._link()
        self.port = _free_port(self.head_ip)
        self.head = self._ray_start(
            "head",
            [
                "--head",
                "--port", str(self.port),
                "--node-ip-address", self.head_ip,
                "--ray-client-server-port", str(_free_port(self.head_ip)),
                "--dashboard-agent-listen-port", str(_free_port("0.0.0.0")),
                "--include-dashboard", "false",
            ],
            {f"RAY_{k}": str(v) for k, v in FAST_HEALTH.items()},
        )  # fmt: skip
        self.node = self._ray_start(
            "node",
            ["--address", self.address, "--node-ip-address", self.node_ip],
            NODE_ENV,
            netns=True,
        )
        self.wait_nodes(2, timeout)

    def _link(self) -> None:
        sweep_stale()
        self.close_network()  # a previous process of this pid's (never another test's)
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.veth_root, "type", "veth", "peer", "name", self.veth_node)
        _ip("link", "set", self.veth_node, "netns", self.ns)
        with _LOCK.open("a") as lock:  # two test processes never pick the same /30
            fcntl.flock(lock, fcntl.LOCK_EX)
            n = _free_subnet()
            self.head_ip, self.node_ip = f"{SUBNET}.{n}.1", f"{SUBNET}.{n}.2"
            _ip("addr", "add", f"{self.head_ip}/30", "dev", self.veth_root)
        _ip("link", "set", self.veth_root, "up")
        inside = ("netns", "exec", self.ns, "ip")
        _ip(*inside, "addr", "add", f"{self.node_ip}/30", "dev", self.veth_node)
        _ip(*inside, "link", "set", self.veth_node, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def _ray_start(
        self, name: str, args: list[str], env: dict[str, str], *, netns: bool = False
    ) -> subprocess.Popen[bytes]:
        temp = self.tmp / name
        temp.mkdir()
        argv = [
            _ray_bin(), "start", *args,
            "--num-gpus", str(GPUS_PER_NODE), "--num-cpus", "2",
            "--object-store-memory", str(80 << 20),
            "--temp-dir", str(temp),
            "--min-worker-port", "0", "--max-worker-port", "0",
            "--disable-usage-stats", "--block",
        ]  # fmt: skip
        if netns:  # its own network and host name: another host, as far as anyone can tell
            script = 'hostname "$0" && exec "$@"'
            argv = ["ip", "netns", "exec", self.ns, "unshare", "-u", "sh", "-c", script,
                    self.hostname, *argv]  # fmt: skip
        full = {
            **os.environ,
            **env,
            TAG_ENV: self.tag,
            "RAY_TMPDIR": str(temp),
            "GPUSWARM_RAY_SCRATCH": str(self.scratch / name),
        }
        log = (self.tmp / f"{name}.log").open("wb")
        with log:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full,
                start_new_session=True,
            )

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    # -- the partition --------------------------------------------------------------------------
    def cut(self, how: str = "drop") -> None:
        """Partition node B. ``drop`` (a switch between them died): the link stays up and every
        packet over it is dropped (nftables, in node B's namespace, its end of the link only),
        so both sides find out only by timeouts; ``down``: the root end of the link goes down,
        so the head's side fails at once (no route)."""
        if how == "down":
            _ip("link", "set", self.veth_root, "down")
        elif how == "drop":
            dev = self.veth_node
            rules = (
                "table inet gsnn {\n"
                f' chain in {{ type filter hook input priority 0; iifname "{dev}" drop; }}\n'
                f' chain out {{ type filter hook output priority 0; oifname "{dev}" drop; }}\n'
                "}\n"
            )
            subprocess.run(
                ["ip", "netns", "exec", self.ns, "nft", "-f", "-"],
                input=rules,
                text=True,
                check=True,
                timeout=30,
            )
        else:
            raise ValueError(f"cut how={how!r}: down or drop")
        self.cut_how = how

    def restore(self) -> None:
        """Undo :meth:`cut`: the link carries packets again."""
        if self.cut_how == "down":
            _ip("link", "set", self.veth_root, "up")
        elif self.cut_how == "drop":
            subprocess.run(
                ["ip", "netns", "exec", self.ns, "nft", "delete", "table", "inet", "gsnn"],
                check=True,
                timeout=30,
            )
        self.cut_how = None

    # -- asking Ray (from a subprocess) ---------------------------------------------------------
    def query(self, timeout: float = 60.0) -> dict[str, Any]:
        """``{"nodes": ray.nodes(), "actors": [named actors]}``, asked by a short-lived driver."""
        code = textwrap.dedent(
            """
            import json, logging, sys
            import ray
            from ray.util import list_named_actors
            ray.init(address=sys.argv[1], log_to_driver=False, logging_level=logging.ERROR)
            names = [a["name"] for a in list_named_actors(all_namespaces=True)]
            print(json.dumps({"nodes": ray.nodes(), "actors": names}, default=str))
            """
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        out = subprocess.run(
            [sys.executable, "-c", code, self.address],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**env, "RAY_TMPDIR": str(self.tmp / "head"), TAG_ENV: self.tag},
            check=False,
        )
        if out.returncode != 0:
            raise AssertionError(f"asking Ray at {self.address} failed: {out.stderr[-2000:]}")
        data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return data

    def wait_nodes(self, count: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            for name, proc in (("head", self.head), ("node", self.node)):
                if proc is not None and proc.poll() is not None:
                    raise AssertionError(f"ray start of the {name} ended:\n{self.log(name)}")
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                alive = [n for n in self.query()["nodes"] if n.get("Alive")]
                if len(alive) >= count:
                    return alive
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{count} Ray nodes not up within {timeout}s\n--- head\n{self.log('head')}"
                    f"\n--- node\n{self.log('node')}"
                )
            time.sleep(0.5)

    # -- processes ------------------------------------------------------------------------------
    def processes(self) -> list[psutil.Process]:
        """Every live process of both nodes and whatever they started: those with the tag in
        their environment, in node B's namespace, or naming the temp folder (Ray's own)."""
        found = {p.pid: p for p in env_processes(TAG_ENV, self.tag)}
        inside = set(self.namespace_pids())
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                ours = proc.pid in inside or str(self.tmp) in " ".join(proc.info["cmdline"] or ())
                if ours and proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE:
                    found.setdefault(proc.pid, proc)
        return list(found.values())

    def namespace_pids(self) -> list[int]:
        done = _ip("netns", "pids", self.ns, check=False)
        return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []

    def close(self) -> None:
        """End every process of both nodes, delete the namespace and link, remove the temp
        folder: safe to call in any state, twice."""
        for proc in (self.node, self.head):
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for _ in range(3):  # what they started may start more while we kill
            procs = self.processes()
            if not procs:
                break
            kill_processes(procs)
        for proc in (self.node, self.head):
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        self.close_network()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def close_network(self) -> None:
        _ip("link", "delete", self.veth_root, check=False)  # takes its peer with it
        _ip("netns", "delete", self.ns, check=False)
