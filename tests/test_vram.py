"""Issue 19, in process: the NVML door under driver skew, the VRAM sampler's attribution and
release wait, the packing arithmetic, OOM retry sizing, gpu_memory values, MIG, auto:free.

The GPUs are the fake NVML's (tests/fakes/nvml/pynvml.py) and the processes real ones: a local
attempt (the real backend) whose child and grandchild "hold" GPU memory."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakenvml import GPU_TASK, FakeMachine, gpu, load_fake
from pydantic import ValidationError

from gpuswarm.app.planning import tasks_per_gpu
from gpuswarm.config.load import load_command_list, load_config
from gpuswarm.config.models import TaskOptions
from gpuswarm.core.errors import GpuSpecError
from gpuswarm.core.models import AttemptRecord, EndKind
from gpuswarm.core.paths import RunPaths
from gpuswarm.exec.base import LaunchSpec
from gpuswarm.exec.local.process import Attempt
from gpuswarm.placement.devices import Gpu, GpuSet, Vendor
from gpuswarm.placement.gpus import (
    Slot,
    free_gpus,
    isolation_env,
    memory_slots,
    parse_gpu_spec,
    plan_slots,
)
from gpuswarm.placement.nvml import AmdSmiQuery, NvmlQuery
from gpuswarm.placement.probes import nvml_gpus
from gpuswarm.placement.vram import VramSampler
from gpuswarm.store.ledger import Ledger
from gpuswarm.store.queue import DirQueue
from gpuswarm.store.staging import create_layout
from gpuswarm.supervise import packing
from gpuswarm.supervise.context import Shared, SupervisorConfig
from gpuswarm.supervise.oom import oom_retry_need
from gpuswarm.supervise.packing import GpuPlacement

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[FakeMachine]:
    m = FakeMachine(tmp_path / "nvml", [gpu(0), gpu(1, 8192)])
    yield m
    m.close()


def query(m: FakeMachine, monkeypatch: pytest.MonkeyPatch) -> NvmlQuery:
    q = NvmlQuery.open(load_fake(m.root, monkeypatch))
    assert q is not None
    return q


# -- the NVML door -----------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["v3", "v2", "v1"])
def test_process_query_falls_back_to_what_the_driver_answers(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch, api: str
) -> None:
    machine.set(api=api)
    machine.foreign_process("GPU-fake-0000", 1234)
    look = query(machine, monkeypatch).sample("GPU-fake-0000")
    assert look.procs is not None and [p.used_mb for p in look.procs] == [1234]
    assert look.total_mb == 16384 and look.used_mb == 1234 and look.util == 50


def test_an_old_library_without_v3_uses_v2(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.set(library="old")
    fake = load_fake(machine.root, monkeypatch)
    assert not hasattr(fake, "nvmlDeviceGetComputeRunningProcesses_v3")
    q = NvmlQuery.open(fake)
    assert q is not None
    assert q.sample(0).procs == ()


def test_unsupported_and_hidden_values_are_not_measured(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.foreign_process("GPU-fake-0000", 500)
    machine.set(api="none", util_error=True)
    q = query(machine, monkeypatch)
    look = q.sample("GPU-fake-0000")
    assert look.procs is None and look.util is None and look.used_mb == 500
    machine.set(api="v3", hide_used=True)
    look = q.sample("GPU-fake-0000")
    assert look.procs is not None and look.procs[0].used_mb is None  # NVML_VALUE_NOT_AVAILABLE


def test_init_failure_and_unknown_devices_never_raise(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = query(machine, monkeypatch)
    assert q.sample("GPU-nope").procs is None
    assert q.sample(17).total_mb is None
    machine.set(init_error=True)
    assert NvmlQuery.open(load_fake(machine.root, monkeypatch)) is None


def test_mig_instances_are_gpus_found_by_their_uuid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migs = [{"uuid": f"MIG-fake-{k}", "memory_mb": 10240} for k in range(3)]
    m = FakeMachine(tmp_path / "nvml", [gpu(0, 81920, mig=migs), gpu(1, 81920)])
    found = nvml_gpus(load_fake(m.root, monkeypatch))
    assert [(g.index, g.uuid, g.memory_mb) for g in found] == [
        (0, "MIG-fake-0", 10240),
        (1, "MIG-fake-1", 10240),
        (2, "MIG-fake-2", 10240),
        (3, "GPU-fake-0001", 81920),
    ]
    slots = plan_slots(GpuSet(Vendor.NVIDIA, tuple(found), "auto"))
    assert isolation_env(slots[1])["CUDA_VISIBLE_DEVICES"] == "MIG-fake-1"
    assert isolation_env(slots[3])["CUDA_VISIBLE_DEVICES"] == "3"


def test_auto_free_keeps_only_gpus_without_a_process(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = load_fake(machine.root, monkeypatch)
    found = GpuSet(Vendor.NVIDIA, tuple(nvml_gpus(fake)), "auto")
    machine.foreign_process("GPU-fake-0000", 100)
    picked = parse_gpu_spec(
        "auto:free", discover_fn=lambda: found, query_fn=lambda v: NvmlQuery.open(fake)
    )
    assert picked.ids == (1,) and picked.spec == "auto:free"
    machine.foreign_process("GPU-fake-0001", 100)
    with pytest.raises(GpuSpecError, match="every GPU is in use"):
        free_gpus(found, lambda v: NvmlQuery.open(fake))
    with pytest.raises(GpuSpecError, match="cannot be seen"):
        free_gpus(found, lambda v: None)


# -- the sampler ---------------------------------------------------------------------------------
def _tree_task(tmp_path: Path, env: dict[str, str], mb: int, child_mb: int) -> Attempt:
    argv = [sys.executable, str(GPU_TASK), "--mb", str(mb), "--hold", "20", "--children", "1"]
    argv += ["--child-mb", str(child_mb), "--grandchild"]
    spec = LaunchSpec(argv, {**os.environ, **env}, tmp_path, tmp_path / "a" / "out.log", 30)
    return Attempt.launch(spec)


def _until(check: Any, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_child_and_grandchild_memory_is_the_attempts_and_a_stranger_is_foreign(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    q = query(machine, monkeypatch)
    gpus = [Gpu(0, "x", Vendor.NVIDIA, "GPU-fake-0000", 16384)]
    sampler = VramSampler(q, gpus, release_timeout=60)
    machine.foreign_process("GPU-fake-0000", 700)
    env = {"FAKE_NVML_DIR": str(machine.root), "CUDA_VISIBLE_DEVICES": "0"}
    attempt = _tree_task(tmp_path, env, 3000, 400)
    try:
        sampler.watch("t/1", [0], attempt.pids)
        _until(lambda: len(list((machine.root / "procs").glob("*.json"))) == 4)
        sampler.tick()
        state = sampler.snapshot()[0]
        assert state.ours_mb == {"t/1": 3000 + 400 + 400}  # main + child + grandchild
        assert state.foreign_mb == 700 and len(state.foreign_pids) == 1
        assert sampler.current_mb("t/1") == 3800
    finally:
        attempt.cancel(hard=True)
        end = attempt.wait()
    assert end.kind is EndKind.CANCELLED
    usage = sampler.end("t/1")
    assert usage is not None and usage.peak_mb == 3800 and usage.samples == 1
    assert usage.peak_util == 50
    sampler.tick()  # everything of it is dead: released at once
    assert sampler.releasing(0) == []


def test_release_wait_then_held_then_freed(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = query(machine, monkeypatch)
    held: list[tuple[int, str, int]] = []
    freed: list[int] = []
    sampler = VramSampler(
        q,
        [Gpu(0, "x", Vendor.NVIDIA, "GPU-fake-0000", 16384)],
        release_timeout=0.2,
        on_held=lambda g, k, pids, mb: held.append((g, k, mb)),
        on_freed=lambda g, k: freed.append(g),
    )
    worker = machine.foreign_process("GPU-fake-0000", 2048)  # its escaped dataloader, say
    sampler.watch("t/1", [0], lambda: [worker.pid])
    sampler.tick()
    assert sampler.end("t/1") is not None
    sampler.tick()
    assert sampler.releasing(0) == ["t/1"] and not held
    time.sleep(0.25)
    sampler.tick()
    assert held == [(0, "t/1", 2048)] and sampler.held() == {0: "t/1"}
    worker.kill()
    worker.wait()
    sampler.tick()
    assert sampler.releasing(0) == [] and freed == [0] and sampler.held() == {}


def test_nothing_measured_without_a_process_list(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.set(api="none")
    sampler = VramSampler(query(machine, monkeypatch), [Gpu(0, "x", Vendor.NVIDIA, None)])
    sampler.watch("t/1", [0], lambda: [os.getpid()])
    sampler.tick()
    assert sampler.end("t/1") is None  # "not measured", never 0


def test_hidden_per_process_memory_counts_the_gpu_when_alone(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.set(hide_used=True)
    proc = machine.foreign_process("GPU-fake-0001", 3000)
    sampler = VramSampler(query(machine, monkeypatch), [Gpu(1, "x", Vendor.NVIDIA, None)])
    sampler.watch("t/1", [1], lambda: [proc.pid])
    sampler.tick()
    usage = sampler.end("t/1")
    assert usage is not None and usage.peak_mb == 3000


def test_a_backend_that_cannot_say_its_pids_leaves_them_foreign(
    machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> list[int]:
        raise RuntimeError("docker is gone")

    machine.foreign_process("GPU-fake-0000", 100)
    sampler = VramSampler(query(machine, monkeypatch), [Gpu(0, "x", Vendor.NVIDIA, None)])
    sampler.watch("t/1", [0], broken)
    sampler.tick()
    assert sampler.snapshot()[0].foreign_mb == 100
    usage = sampler.end("t/1")
    assert usage is not None and usage.peak_mb == 0


# -- sizes, slots, OOM ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "mb"),
    [
        ("20G", 20480),
        ("20GB", 20480),
        ("20GiB", 20480),
        ("512M", 512),
        ("1.5T", 1572864),
        (" 8 g ", 8192),
    ],
)
def test_gpu_memory_values(text: str, mb: int) -> None:
    assert TaskOptions.model_validate({"gpu_memory": text}).gpu_memory == mb


@pytest.mark.parametrize("bad", ["20", 20, "lots", "0M", "-1G", "100T", True])
def test_gpu_memory_refuses_sizes_without_a_clear_unit(bad: object) -> None:
    with pytest.raises(ValidationError, match="gpu_memory"):
        TaskOptions.model_validate({"gpu_memory": bad})


def test_memory_slots() -> None:
    assert memory_slots([8192, 20480], [81920, 40960]) == 5
    assert memory_slots([1024], [81920]) == 16  # capped
    assert memory_slots([], [81920]) == 1 and memory_slots([8192], []) == 1
    assert memory_slots([99999], [81920]) == 1


def _record(peak: int | None) -> AttemptRecord:
    rec = AttemptRecord.launched(
        n=1,
        slot="s",
        gpus=[0],
        started=0,
        ended=1,
        duration=1,
        kind=EndKind.EXITED,
        returncode=1,
        signal=None,
        reason="exit 1",
        oom=True,
        killed=0,
    )
    return rec.but(peak_vram_mb=peak)


def test_oom_retry_needs_a_quarter_more_than_the_peak() -> None:
    assert oom_retry_need(_record(8000), 4096) == 10000
    assert oom_retry_need(_record(None), 4096) == 5120  # no peak: 1.25x the reservation
    assert oom_retry_need(_record(1000), 4096) == 5120  # never less than it had
    assert oom_retry_need(_record(None), None) is None


def test_attempt_record_keeps_gpu_use_through_json() -> None:
    rec = _record(1234).but(mean_vram_mb=1000, peak_gpu_util=97, mean_gpu_util=40)
    again = AttemptRecord.from_json(rec.to_json())
    assert (again.peak_vram_mb, again.mean_vram_mb, again.peak_gpu_util) == (1234, 1000, 97)
    assert "peak_vram_mb" not in _record(None).to_json()


# -- the claim predicate -------------------------------------------------------------------------
def test_a_refused_task_stays_pending_and_the_next_one_is_claimed(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    create_layout(paths)
    q = DirQueue(paths, durable=False)
    big = q.submit({"id": "big", "name": "big", "command": "x"}, 1)
    q.submit({"id": "small", "name": "small", "command": "x"}, 2)
    got = q.claim("me", 0, accept=lambda name: name != big)
    assert got is not None and got.task_id == "small"
    assert q.claim("me", 0, accept=lambda name: False) is None
    got = q.claim("me", 0)
    assert got is not None and got.task_id == "big"


# -- slots per GPU from the config ---------------------------------------------------------------
def _gpus(*totals: int) -> GpuSet:
    return GpuSet(
        Vendor.NVIDIA,
        tuple(Gpu(i, "x", Vendor.NVIDIA, f"GPU-{i}", t) for i, t in enumerate(totals)),
        "auto",
    )


def test_slots_per_gpu_follow_declared_memory_unless_tasks_per_gpu_is_set(tmp_path: Path) -> None:
    body = "tasks:\n  - {command: a, gpu_memory: 10G}\n  - {command: b, gpu_memory: 30G}\n"
    (tmp_path / "a.yaml").write_text(body)
    (tmp_path / "b.yaml").write_text("tasks_per_gpu: 2\n" + body)
    (tmp_path / "c.yaml").write_text("tasks:\n  - {command: a}\n")
    assert tasks_per_gpu(load_config(tmp_path / "a.yaml"), _gpus(81920, 40960)) == 4
    assert tasks_per_gpu(load_config(tmp_path / "b.yaml"), _gpus(81920)) == 2  # a hard cap
    assert tasks_per_gpu(load_config(tmp_path / "c.yaml"), _gpus(81920)) == 1  # the default
    listed = load_command_list(
        None, "a\nb\n", base_dir=tmp_path, defaults=TaskOptions.from_cli(gpu_memory="8G")
    )
    assert tasks_per_gpu(listed, _gpus(81920)) == 10
    assert tasks_per_gpu(listed, GpuSet(Vendor.SIM, (Gpu(0, "sim", Vendor.SIM),), "sim:1")) == 1


# -- AMD through amdsmi -------------------------------------------------------------------------
class FakeAmdSmi:
    """The few amdsmi calls gpuswarm makes (ROCm's bindings are not installed here)."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def amdsmi_init(self) -> None:
        if self.broken:
            raise RuntimeError("no driver")

    def amdsmi_get_processor_handles(self) -> list[str]:
        return ["h0"]

    def amdsmi_get_gpu_device_uuid(self, h: str) -> str:
        return "amd-uuid-0"

    def amdsmi_get_gpu_vram_usage(self, h: str) -> dict[str, int]:
        return {"vram_total": 65536, "vram_used": 3000}

    def amdsmi_get_gpu_asic_info(self, h: str) -> dict[str, str]:
        return {"market_name": "AMD Instinct MI300X"}

    def amdsmi_get_gpu_activity(self, h: str) -> dict[str, Any]:
        return {"gfx_activity": "N/A"}  # unsupported: not measured

    def amdsmi_get_gpu_process_list(self, h: str) -> list[dict[str, Any]]:
        return [{"pid": 4242, "memory_usage": {"vram_mem": 2000 << 20}}]


def test_amd_gpus_through_amdsmi_and_its_absence() -> None:
    q = AmdSmiQuery.open(FakeAmdSmi())
    assert q is not None
    (dev,) = q.devices()
    assert (dev.name, dev.uuid, dev.memory_mb) == ("AMD Instinct MI300X", "amd-uuid-0", 65536)
    look = q.sample("amd-uuid-0")
    assert look.used_mb == 3000 and look.util is None
    assert look.procs is not None and [(p.pid, p.used_mb) for p in look.procs] == [(4242, 2000)]
    assert AmdSmiQuery.open(FakeAmdSmi(broken=True)) is None


def test_research_memory_is_the_printed_peak_else_the_measured_one() -> None:
    from gpuswarm.research.outcome import memory_gb

    assert memory_gb(2048.0, 9999) == 2.0  # the script said so
    assert memory_gb(None, 5120) == 5.0  # it printed nothing: gpuswarm measured it
    assert memory_gb(None, None) is None


# -- the placement predicate in process ---------------------------------------------------------
def _placement(tmp_path: Path, total_mb: int) -> tuple[GpuPlacement, DirQueue, Slot]:
    paths = RunPaths(tmp_path / "run")
    create_layout(paths)
    queue = DirQueue(paths, durable=False)
    ledger = Ledger(paths.events, durable=False)
    gpus = GpuSet(Vendor.NVIDIA, (Gpu(0, "x", Vendor.NVIDIA, "GPU-0", total_mb),), "0")
    slots = plan_slots(gpus, tasks_per_gpu=4)
    cfg = SupervisorConfig(slots, tmp_path, "me")
    run = Shared(paths, queue, ledger, cfg, lambda: None, lambda: None, lambda: None)
    return GpuPlacement(run, slots, query=None), queue, slots[0]


def _submit(queue: DirQueue, name: str, gib: int | None, priority: int, seq: int) -> None:
    task = {"id": name, "name": name, "command": "x", "priority": priority}
    if gib is not None:
        task["gpu_memory_mb"] = gib * 1024
    queue.submit(task, seq)


def _claim(placement: GpuPlacement, queue: DirQueue, slot: Slot) -> str | None:
    got = queue.claim("me", slot.index, placement.accept(slot))
    if got is None:
        return None
    placement.reserve(slot, got)
    return got.task_id


def test_claims_reserve_at_once_backfill_and_stop_backfilling_for_a_starving_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    placement, queue, slot = _placement(tmp_path, 16384)
    _submit(queue, "first", 8, 9, 1)
    _submit(queue, "big", 12, 5, 2)
    _submit(queue, "small1", 4, 0, 3)
    _submit(queue, "small2", 4, 0, 4)
    _submit(queue, "small3", 4, 0, 5)
    assert _claim(placement, queue, slot) == "first"  # 8 of 16 GiB reserved, nothing runs yet
    assert _claim(placement, queue, slot) == "small1"  # big (12) does not fit 8: passed over
    monkeypatch.setattr(packing, "BACKFILL_LIMIT_SECONDS", 0.0)
    assert _claim(placement, queue, slot) is None  # big waited long enough: small2 waits too
    assert placement.waiting()


def test_undeclared_tasks_take_their_share_and_a_need_larger_than_any_gpu_runs_alone(
    tmp_path: Path,
) -> None:
    placement, queue, slot = _placement(tmp_path / "a", 16384)
    _submit(queue, "whole", None, 9, 1)  # declares nothing: the whole GPU (gpu_share 1)
    _submit(queue, "small", 1, 0, 2)
    assert _claim(placement, queue, slot) == "whole"
    assert _claim(placement, queue, slot) is None  # nothing beside a whole-GPU task
    placement, queue, slot = _placement(tmp_path / "b", 16384)
    _submit(queue, "huge", 100, 5, 1)
    _submit(queue, "small", 1, 0, 2)
    assert _claim(placement, queue, slot) == "huge"  # alone on an empty GPU, never forever
    assert _claim(placement, queue, slot) is None


def test_simulated_gpus_may_carry_a_memory_size() -> None:
    found = parse_gpu_spec("sim:2xA100@40G,1xH100@80G")
    assert [(g.name, g.memory_mb) for g in found.gpus] == [
        ("A100", 40960),
        ("A100", 40960),
        ("H100", 81920),
    ]
    assert found.spec == "sim:2xA100@40G,1xH100@80G"
    assert parse_gpu_spec("sim:3@512M").spec == "sim:3@512M"
    assert parse_gpu_spec("sim:3").gpus[0].memory_mb is None
    with pytest.raises(GpuSpecError, match="has no unit"):
        parse_gpu_spec("sim:4@80")
