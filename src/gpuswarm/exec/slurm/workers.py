"""One ``gpuswarm work RUN`` per other node of the allocation, started with ``srun``.

Before any is started, every other node must see the run folder: a probe file with a random
token is written into it, and one step on those nodes reads it back (``srun --overlap``, one
task per node); a node that does not find the token is bad input (exit 2 naming the folder and
the nodes). The workers then run as one step (``--overlap``: beside the step or batch script
gpuswarm runs in, on the GPUs Slurm granted each node, which their ``--gpus auto`` takes), each
node's output in ``slurm/worker-<node>.log`` of the run folder. :meth:`Workers.stop` forwards
``SIGUSR1`` (srun passes it on to every task: each worker stops warm), then waits.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from gpuswarm.core.errors import BackendError, ConfigError
from gpuswarm.exec.slurm.allocation import Allocation

_PROBE = (
    'if [ "$(cat "$1" 2>/dev/null)" = "$2" ]; then echo "ok $SLURMD_NODENAME"; '
    'else echo "missing $SLURMD_NODENAME"; fi'
)
PROBE_TIMEOUT = 120.0
STOP_WAIT = 60.0


def _step(alloc: Allocation) -> list[str]:
    count = str(len(alloc.others))
    return [
        "srun", "--overlap", f"--jobid={alloc.job_id}",
        f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1",
        f"--nodelist={','.join(alloc.others)}", "--kill-on-bad-exit=0",
    ]  # fmt: skip


def check_shared(alloc: Allocation, run_dir: Path) -> None:
    """Every other node reads the probe back, else ConfigError naming the folder."""
    folder = run_dir / "slurm"
    folder.mkdir(exist_ok=True)
    token = secrets.token_hex(16)
    probe = folder / f"probe-{token[:8]}"
    probe.write_text(token)
    try:
        argv = [*_step(alloc), "sh", "-c", _PROBE, "sh", str(probe.resolve()), token]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"slurm: checking the nodes see {run_dir}: {exc}") from None
    finally:
        probe.unlink(missing_ok=True)
    seen = {line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("ok ")}
    blind = [n for n in alloc.others if n not in seen]
    if blind and done.returncode != 0 and not done.stdout.strip():
        said = done.stderr.strip()[-500:]
        raise BackendError(f"slurm: srun on {', '.join(blind)} failed: {said}")
    if blind:
        raise ConfigError(
            f"run folder {run_dir.resolve()} is not on a filesystem every node of the allocation "
            f"sees: {', '.join(blind)} cannot read it; put the workspace on a shared filesystem "
            "(--workspace, workspace: in the config)"
        )


class Workers:
    """The ``srun`` step of ``gpuswarm work`` on every other node."""

    def __init__(self, alloc: Allocation, run_dir: Path, quiet: bool = True) -> None:
        self.alloc = alloc
        self.run_dir = run_dir
        self.log = run_dir / "slurm" / "workers.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.quiet = quiet

    def start(self) -> None:
        out = (self.run_dir / "slurm").resolve()
        out.mkdir(exist_ok=True)
        argv = [
            *_step(self.alloc), f"--output={out}/worker-%N.log",
            sys.executable, "-m", "gpuswarm", "work", str(self.run_dir.resolve()),
            "--gpus", "auto", "--plain", "--no-report",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "GPUSWARM_SLURM_WORKER"}
        env["GPUSWARM_SLURM_WORKER"] = "1"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def stop(self, *, warm: bool) -> int | None:
        """End the step: SIGUSR1 (each worker stops warm) unless they ended by themselves."""
        proc = self.proc
        if proc is None:
            return None
        if warm and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGUSR1)
        try:
            return proc.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                return proc.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                return proc.wait()

    def wait(self) -> int | None:
        return None if self.proc is None else self.proc.wait()
