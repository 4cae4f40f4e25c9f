"""A real Slurm cluster of two compute nodes on this one machine, for the ``slurm`` tests.

Debian's ``slurm-wlm`` runs several ``slurmd`` on one host when each node line has its own
``Port=`` (``slurmd -N NAME`` picks its line): here nodes ``gsn1`` and ``gsn2``, each
``slurmd`` in a UTS namespace of its own (its host name is the node's: gpuswarm, its leases and
its slot ids see two hosts) and a mount namespace of its own (``<tmp>/local`` is a tmpfs of the
node's: a folder no other node sees, for the shared-filesystem check). ``munged`` (a key of its
own, its socket in the temp folder: ``AuthInfo=socket=``) and ``slurmctld`` run beside them; all
state, spool, pid and log files are in the cluster's temp folder, and every client reaches the
cluster through ``SLURM_CONF`` (:attr:`SlurmCluster.env`), never ``/etc/slurm``.

What is simulated: the GPUs only. Each node has two ``gpu`` gres backed by device files made for
the test (``mknod ... c 1 3``: /dev/null's numbers); Slurm hands them out, sets
``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``/``CUDA_VISIBLE_DEVICES`` as on a GPU node, and gpuswarm's
``--gpus auto`` takes them as simulated GPUs (``GPUSWARM_SLURM_SIM_GPUS=1``, no NVML here).

:func:`require_slurm` skips without root or the programs; under ``CI=true`` or
``GPUSWARM_REQUIRE_SLURM=1`` it fails instead.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

NODES = ("gsn1", "gsn2")
GPUS_PER_NODE = 2
# a step credential's lifetime; also how long a requeued job waits before it runs again
# (Slurm's default, 120 s, would make a requeue test wait two minutes)
CRED_EXPIRE = 20
OWNER_FILE = "owner.pid"  # the test process that made a cluster (sweep_stale)
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "salloc", "squeue", "scontrol")


def slurm_required() -> bool:
    env = os.environ
    return env.get("CI", "").lower() == "true" or env.get("GPUSWARM_REQUIRE_SLURM") == "1"


def require_slurm() -> None:
    """Skip (fail under CI=true / GPUSWARM_REQUIRE_SLURM=1) where no cluster can be made."""
    why = None
    missing = [p for p in (*PROGRAMS, "unshare", "mknod") if shutil.which(p) is None]
    if os.geteuid() != 0:
        why = "a test Slurm cluster needs root (slurmd, mknod, namespaces)"
    elif missing:
        why = f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    if why is None:
        return
    if slurm_required():
        pytest.fail(f"{why}, and CI / GPUSWARM_REQUIRE_SLURM=1 asks for it", pytrace=False)
    pytest.skip(why)


def sweep_stale() -> int:
    """End what a test process that was killed outright left behind: every process of a
    cluster whose owner (``owner.pid``) is gone (they carry its ``SLURM_CONF``), then its
    folder. How many clusters it removed."""
    from cli_driver import env_processes, kill_processes

    removed = 0
    for root in Path(tempfile.gettempdir()).glob("gsslurm-*"):
        try:
            owner = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if psutil.pid_exists(owner):
            continue
        conf = str(root / "etc" / "slurm.conf")
        for _ in range(3):
            procs = env_processes("SLURM_CONF", conf)
            if not procs:
                break
            kill_processes(procs)
        shutil.rmtree(root, ignore_errors=True)
        removed += 1
    return removed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _uts_inode(pid: int) -> int | None:
    try:
        return Path(f"/proc/{pid}/ns/uts").stat().st_ino
    except OSError:
        return None


class SlurmCluster:
    """munged + slurmctld + one slurmd per node of :data:`NODES`, all under :attr:`root`."""

    def __init__(self, root: Path | None = None) -> None:
        # AF_UNIX paths (munge's socket) must stay short: a temp folder of its own
        self.root = root or Path(tempfile.mkdtemp(prefix="gsslurm-"))
        self.name = "gs" + secrets.token_hex(3)
        self.conf = self.root / "etc" / "slurm.conf"
        self.local = self.root / "local"  # a tmpfs of each node's own (not shared)
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.node_uts: dict[str, int] = {}
        self.started_in = 0.0  # seconds from munged's start to every node idle
        self.dead: set[str] = set()  # nodes kill_node killed (revive starts them again)

    @property
    def env(self) -> dict[str, str]:
        """What a client (srun, sbatch, gpuswarm) needs to reach this cluster."""
        return {
            "SLURM_CONF": str(self.conf),
            "GPUSWARM_SLURM_SIM_GPUS": "1",
        }

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        env.update(self.env)
        env.update(extra or {})
        return env

    # -- files ----------------------------------------------------------------------------------
    def _write(self) -> None:
        r = self.root
        for sub in ("etc", "state", "log", "munge", "dev", *(f"spool/{n}" for n in NODES)):
            (r / sub).mkdir(parents=True, exist_ok=True)
        self.local.mkdir(exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        for i in range(GPUS_PER_NODE * len(NODES)):
            dev = r / "dev" / f"gpu{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device
        ports = {n: _free_port() for n in NODES}
        nodes = "\n".join(
            f"NodeName={n} NodeHostname={n} NodeAddr=127.0.0.1 Port={ports[n]} CPUs=2 "
            f"Gres=gpu:{GPUS_PER_NODE} RealMemory=1000 State=UNKNOWN"
            for n in NODES
        )
        self.conf.write_text(
            f"ClusterName={self.name}\n"
            "SlurmctldHost=localhost(127.0.0.1)\n"
            f"SlurmctldPort={_free_port()}\n"
            f"SlurmdPort={_free_port()}\n"
            "AuthType=auth/munge\n"
            f"AuthInfo=socket={r}/munge/sock,cred_expire={CRED_EXPIRE}\n"
            "CredType=cred/munge\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={r}/state\n"
            f"SlurmdSpoolDir={r}/spool/%n\n"
            f"SlurmctldPidFile={r}/slurmctld.pid\n"
            f"SlurmdPidFile={r}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={r}/log/slurmctld.log\n"
            f"SlurmdLogFile={r}/log/slurmd-%n.log\n"
            "ProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\n"
            "SelectType=select/cons_tres\n"
            "SelectTypeParameters=CR_Core\n"
            "GresTypes=gpu\n"
            "MpiDefault=none\n"
            "ReturnToService=2\n"
            "SlurmdTimeout=10\n"
            "KillWait=5\n"
            "MinJobAge=300\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            "AccountingStorageType=accounting_storage/none\n"
            "JobCompType=jobcomp/none\n"
            "SchedulerType=sched/backfill\n"
            "PreemptType=preempt/partition_prio\n"  # a job of `urgent` requeues gpu's jobs
            "PreemptMode=REQUEUE\n"
            f"{nodes}\n"
            f"PartitionName=gpu Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=YES PriorityTier=1\n"
            f"PartitionName=urgent Nodes={','.join(NODES)} MaxTime=INFINITE State=UP "
            "PriorityTier=10\n"
        )
        gres = []
        for k, n in enumerate(NODES):
            first = k * GPUS_PER_NODE
            gres.append(
                f"NodeName={n} Name=gpu File={r}/dev/gpu[{first}-{first + GPUS_PER_NODE - 1}]"
            )
        (r / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")

    # -- processes ------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.root / "log" / f"{name}.out").open("wb")
        with log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.client_env(),
                start_new_session=True,
            )
        self.daemons[name] = proc
        return proc

    def start(self, timeout: float = 60.0) -> None:
        """Write the files, start the daemons; back once every node is idle."""
        t0 = time.monotonic()
        sweep_stale()
        self._write()
        (self.root / OWNER_FILE).write_text(str(os.getpid()))
        m = self.root / "munge"
        self._spawn(
            "munged",
            ["munged", "-F", "-f", f"--socket={m}/sock", f"--key-file={m}/key",
             f"--pid-file={m}/pid", f"--log-file={m}/log", f"--seed-file={m}/seed"],
        )  # fmt: skip
        self._wait(lambda: (m / "sock").exists(), timeout, "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        for node in NODES:
            self.start_node(node)
        self.wait_idle(timeout)
        self.started_in = time.monotonic() - t0

    def start_node(self, node: str) -> None:
        """``slurmd -N node`` in UTS and mount namespaces of its own (see the module doc)."""
        script = (
            'mount -t tmpfs -o size=64m gslocal "$1" && hostname "$0" && shift '
            '&& exec slurmd -D -N "$0"'
        )
        proc = self._spawn(
            f"slurmd-{node}",
            ["unshare", "-u", "-m", "--propagation", "private", "sh", "-c", script, node,
             str(self.local)],
        )  # fmt: skip

        def has_ns() -> bool:
            ino = _uts_inode(proc.pid)
            if ino is not None and ino != _uts_inode(os.getpid()):
                self.node_uts[node] = ino
                return True
            return False

        self._wait(has_ns, 10, f"{node}'s namespace")

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self.daemons.items():
                if proc.poll() is not None and not name.endswith(tuple(self.dead)):
                    raise AssertionError(f"{name} ended (rc {proc.returncode}):\n{self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not ready within {timeout}s:\n{self.logs()}")
            time.sleep(0.05)

    def node_states(self) -> dict[str, str]:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"],
            capture_output=True,
            text=True,
            env=self.client_env(),
            timeout=30,
            check=False,
        )
        states = {}
        for line in out.stdout.splitlines():
            name, _, state = line.partition(" ")
            states[name] = state.strip()
        return states

    def wait_idle(
        self, timeout: float = 60.0, nodes: tuple[str, ...] = NODES, *, busy_ok: bool = False
    ) -> None:
        """Back once every node of ``nodes`` answers (idle; or running jobs: ``busy_ok``)."""
        ok = ("idle", "mix", "alloc") if busy_ok else ("idle",)

        def idle() -> bool:
            states = self.node_states()
            return all(states.get(n) in ok for n in nodes)

        self._wait(idle, timeout, f"nodes {', '.join(nodes)} idle")

    def node_processes(self, node: str) -> list[psutil.Process]:
        """Every live process in ``node``'s namespace: its slurmd, steps and their tasks."""
        want = self.node_uts.get(node)
        found = []
        for proc in psutil.process_iter():
            if want is not None and _uts_inode(proc.pid) == want:
                with contextlib.suppress(psutil.Error):
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
        return found

    def kill_node(self, node: str) -> None:
        """The node crashes: SIGKILL to its slurmd and everything running on it."""
        self.dead.add(node)
        for _ in range(3):
            procs = self.node_processes(node)
            if not procs:
                break
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            psutil.wait_procs(procs, timeout=5)
        daemon = self.daemons.get(f"slurmd-{node}")
        if daemon is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(5)

    def revive(self, node: str) -> None:
        """A killed node boots again: a new slurmd (new namespaces) registers; back when idle
        (``ReturnToService=2`` puts a node that was down back in service)."""
        self.kill_node(node)
        self.daemons.pop(f"slurmd-{node}", None)
        self.start_node(node)
        self.dead.discard(node)
        self.wait_idle(60, (node,))

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Every job cancelled, every node's processes and the daemons ended, the folder gone."""
        for node in NODES:
            self.kill_node(node)
        for name in ("slurmctld", "munged"):
            proc = self.daemons.get(name)
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        for proc in self.daemons.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
