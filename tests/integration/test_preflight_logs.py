"""Issue 30: a preflight command's output is kept under ``reliability.max_log_mb`` like a task's
log (it was kept whole: 96 MiB per slot with ``max_log_mb: 1``), and the slot's preflight log is
private."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cli_driver import CliResult

from gpuswarm.core.errors import PreflightError
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import BackendOptions
from gpuswarm.exec.local.backend import LocalBackend
from gpuswarm.placement.gpus import parse_gpu_spec, plan_slots
from gpuswarm.store.leases import host_slug
from gpuswarm.supervise.preflight import run_preflight

Gs = Callable[..., CliResult]
MIB = 1 << 20
LOUD = "head -c 8000000 /dev/zero | tr '\\0' x; echo; echo the-last-line"


def _run_dir(workspace: Path) -> Path:
    runs = sorted(p for p in workspace.glob("*/run_*") if (p / "run.json").is_file())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.slow  # runs the CLI
@pytest.mark.parametrize("fails", [False, True], ids=["passes", "fails"])
def test_a_preflight_output_is_capped_like_a_task_log(
    tmp_path: Path, gpuswarm: Gs, fails: bool
) -> None:
    command = LOUD + ("; exit 4" if fails else "")
    config = {
        "name": "loud",
        "gpus": "sim:2",
        "reliability": {"max_log_mb": 1},
        "preflight": [command, "echo second"],
        "tasks": [{"name": "t", "command": "true"}],
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    res = gpuswarm("run", tmp_path / "c.yaml", "--plain")
    assert res.returncode == (2 if fails else 0), res
    folder = _run_dir(tmp_path / "runs") / "preflight"
    for gpu in (0, 1):
        label = f"{host_slug()}-gpu{gpu}"
        own = folder / label / "cmd-0" / "output.log"
        slot_log = folder / f"{label}.log"
        last = b"the-last-line" if fails else b"second"  # the slot's log: every command
        for log, end in ((own, b"the-last-line"), (slot_log, last)):
            data = log.read_bytes()
            assert len(data) <= MIB + 200, (log, len(data))  # head, the marker, the tail
            assert b"bytes of output dropped here to keep the log under 1048576 bytes" in data
            assert data.rstrip().endswith(end), log
            assert stat.S_IMODE(log.stat().st_mode) == 0o600, log
    if fails:
        assert "preflight failed on" in res.stderr and "exit 4" in res.stderr, res
        assert "the-last-line" in res.stderr and len(res.stderr) < 20_000, res


class _NoPump(LocalBackend):
    """A backend that holds no log's cap itself (like ray's): preflight caps its logs."""

    caps_logs = False


def test_a_backend_without_a_log_pump_gets_its_preflight_log_capped_while_it_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "run").mkdir()
    paths = RunPaths(tmp_path / "run")
    slot = plan_slots(parse_gpu_spec("sim:1"))[0]
    log = paths.root / "preflight" / slot.label / "cmd-0" / "output.log"
    wait = (  # the command itself watches its log shrink under the cap (at most 20 s)
        f"for i in $(seq 100); do [ $(stat -c %s {log}) -le {MIB + 200} ] && exit 0; sleep 0.2; "
        "done; echo never capped; exit 1"
    )
    backend = _NoPump(BackendOptions())  # never opened: no pump, the task writes its log
    labels = run_preflight(
        paths,
        [slot],
        [f"{LOUD}; {wait}"],
        cwd=tmp_path,
        isolate=False,
        provisions=[],
        base_env=dict(os.environ),
        backend=backend,
        max_log_bytes=MIB,
    )
    assert labels == [slot.label]
    assert log.stat().st_size <= MIB + 200


def test_a_link_planted_at_the_slot_log_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "run" / "preflight").mkdir(parents=True)
    paths = RunPaths(tmp_path / "run")
    slot = plan_slots(parse_gpu_spec("sim:1"))[0]
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    (paths.root / "preflight" / f"{slot.label}.log").symlink_to(outside)
    with pytest.raises(PreflightError, match=r"`true` could not start: cannot write .*\.log"):
        run_preflight(
            paths,
            [slot],
            ["true"],
            cwd=tmp_path,
            isolate=False,
            provisions=[],
            base_env=dict(os.environ),
            backend=LocalBackend(BackendOptions()),
        )
    assert outside.read_text() == "keep me\n"  # was truncated through the link
