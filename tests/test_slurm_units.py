"""Slurm's formats as gpuswarm reads them (issue 36): the time left, the GPUs granted."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.app.setup import driver_of
from gpuswarm.config.backends import plugin_of
from gpuswarm.config.load import load_config
from gpuswarm.core.errors import ConfigError, GpuSpecError
from gpuswarm.exec.base import create_backend
from gpuswarm.exec.local.backend import LocalBackend
from gpuswarm.exec.slurm.allocation import current, parse_time_left, stop_before
from gpuswarm.exec.slurm.jobs import job_states, script_text
from gpuswarm.exec.slurm.settings import SlurmSettings
from gpuswarm.placement import slurmgpus
from gpuswarm.placement.devices import Gpu, GpuSet, Vendor
from gpuswarm.placement.gpus import discover
from gpuswarm.ui.nodefeed import NodeFeed


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5", 300.0),  # minutes
        ("0:45", 45.0),  # minutes:seconds
        ("3:58:21", 14301.0),  # hours:minutes:seconds
        ("1-02:03:04", 93784.0),  # days-hours:minutes:seconds
        ("2-03", 183600.0),  # days-hours
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
    ],
)
def test_time_left(text: str, seconds: float | None) -> None:
    assert parse_time_left(text) == seconds


def _found(n: int) -> GpuSet:
    return GpuSet(Vendor.NVIDIA, tuple(Gpu(i, "H100", Vendor.NVIDIA) for i in range(n)), "auto")


def test_granted_gpus_restrict_discovery() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_STEP_GPUS": "2,3"}
    cut = slurmgpus.restrict(_found(4), env)
    assert cut is not None and cut.ids == (2, 3)
    # the step's GPUs before the job's; outside an allocation nothing applies
    both = {**env, "SLURM_JOB_GPUS": "0,1,2,3"}
    assert slurmgpus.granted_ids(both) == (2, 3)
    assert slurmgpus.granted_ids({"SLURM_STEP_GPUS": "1"}) is None


def test_device_cgroup_shows_only_the_granted() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "5,6"}
    cut = slurmgpus.restrict(_found(2), env)  # ConstrainDevices: the node shows 2, renumbered
    assert cut is not None and cut.ids == (0, 1)
    with pytest.raises(GpuSpecError, match="granted GPUs 5,6"):
        slurmgpus.restrict(_found(3), env)


def test_bad_gpu_list_names_the_variable() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,x"}
    with pytest.raises(GpuSpecError, match="SLURM_JOB_GPUS=0,x"):
        slurmgpus.granted_ids(env)


def test_auto_in_salloc_shell_says_where_to_run() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    with pytest.raises(GpuSpecError, match="srun --overlap"):
        discover(run=lambda argv: None, nvml=False, environ=env)


def test_simulated_grant_only_when_asked() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_STEP_GPUS": "0,1"}
    assert slurmgpus.simulated(env) is None
    sim = slurmgpus.simulated({**env, slurmgpus.SIM_VAR: "1"})
    assert sim is not None and sim.vendor is Vendor.SIM and sim.ids == (0, 1)


def test_settings_become_sbatch_options() -> None:
    s = SlurmSettings.model_validate(
        {"partition": "gpu", "account": "proj", "qos": "hi", "time": "4:00:00", "nodes": 2,
         "gpus_per_node": 8, "sbatch_args": ["--constraint=h100"]},
    )  # fmt: skip
    assert s.sbatch_options() == [
        "--nodes=2", "--ntasks-per-node=1", "--partition=gpu", "--account=proj", "--qos=hi",
        "--time=4:00:00", "--gres=gpu:8", "--constraint=h100",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("{time: four hours}", "slurm.time: "),
        ("{partition: 'gpu; rm -rf /'}", "slurm.partition: "),
        ("{nodes: 0}", "slurm.nodes: "),
        ("{max_jobs: 0}", "slurm.max_jobs: "),
        ("{nodez: 2}", "unknown key 'nodez' in slurm; did you mean 'nodes'"),
    ],
)
def test_bad_settings_name_the_field_and_file(tmp_path: Path, raw: str, named: str) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"backend: slurm\nslurm: {raw}\ntasks: [{{command: 'true'}}]\n")
    with pytest.raises(ConfigError, match=rf"run\.yaml:2: {re.escape(named)}"):
        load_config(cfg)


def test_flags_go_over_the_block_and_choose_slurm(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "slurm: {partition: gpu, nodes: 4}\nbackend: slurm\ntasks: [{command: 'true'}]\n"
    )
    flags = {"slurm_nodes": "2", "slurm_time": "1:00:00", "slurm_account": "proj",
             "slurm_qos": "hi", "slurm_gpus_per_node": "8"}  # fmt: skip
    s = load_config(cfg).with_backend(None, flags).config.backend_block()
    assert isinstance(s, SlurmSettings)
    assert s.sbatch_options() == [
        "--nodes=2", "--ntasks-per-node=1", "--partition=gpu", "--account=proj", "--qos=hi",
        "--time=1:00:00", "--gres=gpu:8",
    ]  # fmt: skip
    plain = tmp_path / "plain.yaml"
    plain.write_text("tasks: [{command: 'true'}]\n")
    chosen = load_config(plain).with_backend(None, {"slurm_qos": "hi"}).config
    assert chosen.backend == "slurm"  # a slurm flag alone means --backend slurm
    with pytest.raises(ConfigError, match=r"^--slurm-nodes: "):
        load_config(plain).with_backend(None, {"slurm_nodes": "x"})
    with pytest.raises(ConfigError, match="are slurm's; add --backend slurm"):
        load_config(plain).with_backend("docker", {"slurm_qos": "hi", "image": "img"})


def test_the_plugin_drives_from_here_and_runs_attempts_locally_on_nodes() -> None:
    plugin = plugin_of("slurm")
    assert plugin.settings is SlurmSettings and plugin.driver
    assert {o.decls[0] for o in plugin.options_for("run")} == {
        "--slurm-nodes", "--slurm-time", "--slurm-partition", "--slurm-gpus-per-node",
        "--slurm-account", "--slurm-qos", "--slurm-stop-before",
    }  # fmt: skip
    backend = create_backend("slurm")  # a node's `gpuswarm work`: the attempts are processes
    assert isinstance(backend, LocalBackend) and backend.name == "slurm"
    assert driver_of("slurm") is not None and driver_of("local") is None


def test_job_script_quotes_the_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "a run; $(x)"
    text = script_text(SlurmSettings(setup=["module load cuda"]), run)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and "module load cuda" in lines
    assert shlex.quote(str(run)) in lines[-1]  # a folder's name is never shell syntax
    assert lines[-1].startswith("srun --ntasks-per-node=1 ")


def test_slurm_block_needs_backend_slurm(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("slurm: {nodes: 2}\ntasks: [{command: 'true'}]\n")
    with pytest.raises(ConfigError, match="backend: slurm"):
        load_config(cfg)


def test_a_node_without_slurms_commands_runs_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """SLURM_JOB_ID set where scontrol/squeue cannot run (a container on a node): the run goes
    on, on this node, unbounded, saying why; never an error that stops it."""
    monkeypatch.setenv("PATH", "/nonexistent")
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n[1-2]"}
    alloc = current(env)
    assert alloc is not None and alloc.nodes == ("n1",) and alloc.others == ()
    assert alloc.ends_at is None and alloc.stop_at is None
    assert len(alloc.notes) == 2 and "this node only" in alloc.notes[0]
    assert current({"SLURM_JOB_ID": "7"}) is None  # salloc's shell: not on a node


def test_stop_before_is_a_setting_and_a_flag(tmp_path: Path) -> None:
    """``slurm.stop_before`` (a Duration) and ``--slurm-stop-before`` over it; the variable
    overrides both; a bad flag value names the flag."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("backend: slurm\nslurm: {stop_before: 2m}\ntasks: [{command: 'true'}]\n")
    block = load_config(cfg).config.backend_block()
    assert isinstance(block, SlurmSettings) and block.stop_before == 120.0
    plugin = plugin_of("slurm")
    assert plugin.apply_options is not None
    flagged = plugin.apply_options(block, {"slurm_stop_before": "90s"})
    assert isinstance(flagged, SlurmSettings) and flagged.stop_before == 90.0
    assert SlurmSettings().stop_before == 60.0
    with pytest.raises(ConfigError, match="--slurm-stop-before"):
        plugin.apply_options(None, {"slurm_stop_before": "soon"})
    assert stop_before({}, 90.0) == 90.0
    assert stop_before({"GPUSWARM_SLURM_STOP_BEFORE": "0"}, 90.0) == 0.0  # the override


def test_allocation_takes_the_runs_stop_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    env = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1"}
    alloc = current(env, 300.0)
    assert alloc is not None and alloc.stop_before == 300.0
    default = current(env)
    assert default is not None and default.stop_before == 60.0


def test_job_states_without_accounting_read_squeue_then_ended(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No accounting (the test cluster's): sacct fails; a job squeue still lists keeps its state
    (a requeued one is active), one it no longer lists is ENDED (the driver submits again)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho '11|REQUEUED|n1|Requeued'\n")
    (bin_dir / "sacct").write_text(
        "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    states = job_states(["11", "12"])
    assert states["11"].state == "REQUEUED" and states["11"].active
    assert states["12"].state == "ENDED" and not states["12"].active


def test_node_feed_relays_only_the_other_nodes_slots(tmp_path: Path) -> None:
    """A head's reporter gets the other nodes' slot records from the journal, never its own
    (it heard those already), nor a line of the wrong shape."""
    events = tmp_path / "events.jsonl"
    events.write_text("")
    heard: list[dict[str, Any]] = []
    lines = [
        {"ts": 1.0, "ev": "supervisor_started", "slots": ["n2-gpu0"], "owner": "w", "pid": 9},
        {"ts": 1.0, "ev": "supervisor_started", "slots": ["n1-gpu0"], "owner": "h", "pid": 8},
        {"ts": 1.1, "ev": "started", "task": "t1", "attempt": 1, "slot": "n2-gpu0"},
        {"ts": 1.1, "ev": "started", "task": "t2", "attempt": 1, "slot": "n1-gpu0"},
        {"ts": 1.2, "ev": "started", "task": 5, "slot": "n2-gpu0"},  # the wrong shape
        {"ts": 1.3, "ev": "shutdown", "reason": "a worker's stop"},  # no slot: not relayed
    ]
    with NodeFeed(events, heard.append, ["n1-gpu0"]) as feed:
        with events.open("a") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
        feed.poll()
    assert [(e["ev"], e.get("task")) for e in heard] == [
        ("supervisor_started", None),
        ("started", "t1"),
    ]
