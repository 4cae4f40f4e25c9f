"""Tests for gpuswarm.placement (gpus, probes, devices): discovery with fake NVML / tool outputs,
--gpus, slots, isolation."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from gpuswarm.core.errors import EXIT_BAD_INPUT, GpuSpecError
from gpuswarm.placement import probes
from gpuswarm.placement.devices import Gpu, GpuSet, Vendor, format_ids
from gpuswarm.placement.gpus import (
    Slot,
    discover,
    isolation_env,
    parse_gpu_spec,
    plan_slots,
)
from gpuswarm.placement.probes import nvml_gpus, run_tool

GIB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"

NVIDIA_SMI_OUT = (
    "0, NVIDIA H100 80GB HBM3, GPU-5a3e9c1b-7d2f-4e8a-9b1c-0f2d3e4a5b6c, 81559\n"
    "1, NVIDIA H100 80GB HBM3, GPU-8932f937-d72c-4106-c12f-20bd9faed9f6, 81559\n"
    "2, Tesla V100-SXM2-16GB, [N/A], [N/A]\n"
)

AMD_SMI_JSON_OUT = """WARNING: User is missing the following required groups: render, video.
[
    {
        "gpu": 0,
        "bdf": "0000:0c:00.0",
        "uuid": "77ff74a1-0000-1000-80cb-bba8bc7d8e4e",
        "kfd_id": 36424,
        "node_id": 2,
        "partition_id": 0
    },
    {
        "gpu": 1,
        "bdf": "0000:22:00.0",
        "uuid": "01ff74a1-0000-1000-8031-0e1c5a6f2b09",
        "kfd_id": 10042,
        "node_id": 3,
        "partition_id": 0
    }
]
"""

AMD_SMI_TEXT_OUT = """GPU: 0
    BDF: 0000:0c:00.0
    UUID: 77ff74a1-0000-1000-80cb-bba8bc7d8e4e
    KFD_ID: 36424
    NODE_ID: 2
    PARTITION_ID: 0

GPU: 1
    BDF: 0000:22:00.0
    UUID: 01ff74a1-0000-1000-8031-0e1c5a6f2b09
    KFD_ID: 10042
    NODE_ID: 3
    PARTITION_ID: 0

"""

ROCM_SMI_NAMED_OUT = """

============================ ROCm System Management Interface ============================
=========================================== ID ===========================================
GPU[0]\t\t: Device Name: \t\tAMD Instinct MI300X OAM
GPU[0]\t\t: Device ID: \t\t0x74a1
GPU[0]\t\t: Device Rev: \t\t0x00
GPU[0]\t\t: Subsystem ID: \t0x74a1
GPU[0]\t\t: GUID: \t\t8554
GPU[1]\t\t: Device Name: \t\tAMD Instinct MI300X OAM
GPU[1]\t\t: Device ID: \t\t0x74a1
GPU[1]\t\t: Device Rev: \t\t0x00
GPU[1]\t\t: Subsystem ID: \t0x74a1
GPU[1]\t\t: GUID: \t\t29525
==========================================================================================
================================== End of ROCm SMI Log ===================================
"""

ROCM_SMI_OLD_OUT = """

============================ ROCm System Management Interface ============================
=========================================== ID ===========================================
GPU[0]\t\t: Device ID: 0x74a1
GPU[0]\t\t: Device Rev: 0x0
GPU[1]\t\t: Device ID: 0x74a1
GPU[1]\t\t: Device Rev: 0x0
GPU[2]\t\t: Device ID: 0x74a1
GPU[2]\t\t: Device Rev: 0x0
==========================================================================================
================================== End of ROCm SMI Log ===================================
"""


class FakeNVMLError(Exception):
    pass


class FakeNvml:  # method names are pynvml's
    """The slice of pynvml that discovery uses; devices are dicts."""

    NVMLError = FakeNVMLError

    def __init__(self, devices: list[dict[str, Any]], *, fail: str = "") -> None:
        self.devices = devices
        self.fail = fail
        self.shutdowns = 0

    def _maybe_fail(self, what: str) -> None:
        if self.fail == what:
            raise FakeNVMLError(f"{what} failed")

    def nvmlInit(self) -> None:
        self._maybe_fail("init")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        self._maybe_fail("handle")
        return self.devices[index]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> Any:
        return handle["name"]

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> Any:
        self._maybe_fail("uuid")
        return handle["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> Any:
        return SimpleNamespace(total=handle["mem"], free=0, used=0)


def two_gpu_nvml() -> FakeNvml:
    return FakeNvml(
        [
            {"name": H100.encode(), "uuid": b"GPU-aaaa-0000", "mem": 80 * GIB},
            {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-bbbb-1111", "mem": 40 * GIB},
        ]
    )


def no_nvml() -> FakeNvml:
    return FakeNvml([], fail="init")


class FakeRun:
    """Tool runner returning canned stdout per argv; records every call."""

    def __init__(self, outputs: dict[tuple[str, ...], str] | None = None) -> None:
        self.outputs = outputs or {}
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> str | None:
        self.calls.append(list(argv))
        return self.outputs.get(tuple(argv))


NVIDIA_SMI = tuple(probes.NVIDIA_SMI_ARGV)
AMD_SMI_JSON = ("amd-smi", "list", "--json")
AMD_SMI_TEXT = ("amd-smi", "list")
ROCM_SMI = ("rocm-smi", "--showid")


def h100s(n: int) -> GpuSet:
    return GpuSet(Vendor.NVIDIA, tuple(Gpu(i, H100, Vendor.NVIDIA) for i in range(n)), "auto")


def fixed(gpu_set: GpuSet) -> Callable[[], GpuSet]:
    return lambda: gpu_set


def no_discovery() -> GpuSet:
    raise AssertionError("discovery must not run")


@pytest.fixture(autouse=True)
def _clean_visible_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)


# -- discovery
def test_nvml_two_gpus_bytes_and_str_names() -> None:
    nvml, run = two_gpu_nvml(), FakeRun()
    found = discover(nvml=nvml, run=run, environ={})
    assert found == GpuSet(
        Vendor.NVIDIA,
        (
            Gpu(0, H100, Vendor.NVIDIA, "GPU-aaaa-0000", 81920),
            Gpu(1, "NVIDIA A100-SXM4-40GB", Vendor.NVIDIA, "GPU-bbbb-1111", 40960),
        ),
        "auto",
    )
    assert found.ids == (0, 1)
    assert run.calls == []  # NVML answered, no tool was run
    assert nvml.shutdowns == 1


def test_nvml_uuid_failure_keeps_the_gpu() -> None:
    nvml = two_gpu_nvml()
    nvml.fail = "uuid"
    found = nvml_gpus(nvml)
    assert [(g.index, g.uuid, g.memory_mb) for g in found] == [(0, None, 81920), (1, None, 40960)]


def test_nvml_init_failure_falls_back_to_nvidia_smi() -> None:
    nvml, run = no_nvml(), FakeRun({NVIDIA_SMI: NVIDIA_SMI_OUT})
    found = discover(nvml=nvml, run=run, environ={})
    assert found.vendor is Vendor.NVIDIA
    assert found.gpus == (
        Gpu(0, H100, Vendor.NVIDIA, "GPU-5a3e9c1b-7d2f-4e8a-9b1c-0f2d3e4a5b6c", 81559),
        Gpu(1, H100, Vendor.NVIDIA, "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", 81559),
        Gpu(2, "Tesla V100-SXM2-16GB", Vendor.NVIDIA, None, None),
    )
    assert run.calls == [list(NVIDIA_SMI)]
    assert nvml.shutdowns == 0  # never initialised, so never shut down


def test_nvml_error_while_listing_shuts_down_and_falls_back() -> None:
    nvml = FakeNvml([{"name": "x", "uuid": "u", "mem": 1}], fail="handle")
    found = discover(nvml=nvml, run=FakeRun({NVIDIA_SMI: NVIDIA_SMI_OUT}), environ={})
    assert found.ids == (0, 1, 2)
    assert nvml.shutdowns == 1


def test_missing_pynvml_module_means_no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert nvml_gpus() == []


def test_amd_smi_json_with_warning_line() -> None:
    run = FakeRun({AMD_SMI_JSON: AMD_SMI_JSON_OUT})
    found = discover(nvml=no_nvml(), run=run, environ={})
    assert found.vendor is Vendor.AMD
    assert found.gpus == (  # with its PCI address: the docker backend finds its render node by it
        Gpu(0, "AMD GPU", Vendor.AMD, "77ff74a1-0000-1000-80cb-bba8bc7d8e4e", pci="0000:0c:00.0"),
        Gpu(1, "AMD GPU", Vendor.AMD, "01ff74a1-0000-1000-8031-0e1c5a6f2b09", pci="0000:22:00.0"),
    )
    assert run.calls == [list(NVIDIA_SMI), list(AMD_SMI_JSON)]


def test_amd_smi_plain_text_when_json_fails() -> None:
    run = FakeRun(
        {AMD_SMI_JSON: "Error: unrecognized arguments: --json\n", AMD_SMI_TEXT: AMD_SMI_TEXT_OUT}
    )
    found = discover(nvml=no_nvml(), run=run, environ={})
    assert found.gpus == (
        Gpu(0, "AMD GPU", Vendor.AMD, "77ff74a1-0000-1000-80cb-bba8bc7d8e4e"),
        Gpu(1, "AMD GPU", Vendor.AMD, "01ff74a1-0000-1000-8031-0e1c5a6f2b09"),
    )


def test_rocm_smi_showid_with_device_names() -> None:
    found = discover(nvml=no_nvml(), run=FakeRun({ROCM_SMI: ROCM_SMI_NAMED_OUT}), environ={})
    assert found.gpus == (
        Gpu(0, "AMD Instinct MI300X OAM", Vendor.AMD),
        Gpu(1, "AMD Instinct MI300X OAM", Vendor.AMD),
    )


def test_rocm_smi_showid_old_format() -> None:
    run = FakeRun({ROCM_SMI: ROCM_SMI_OLD_OUT})
    found = discover(nvml=no_nvml(), run=run, environ={})
    assert found.vendor is Vendor.AMD
    assert found.ids == (0, 1, 2)
    assert {g.name for g in found.gpus} == {"AMD GPU 0x74a1"}
    assert run.calls == [list(NVIDIA_SMI), list(AMD_SMI_JSON), list(AMD_SMI_TEXT), list(ROCM_SMI)]


def test_nothing_found_names_every_method_and_the_fixes() -> None:
    garbage = "No devices were found\n"
    run = FakeRun({NVIDIA_SMI: garbage, AMD_SMI_JSON: garbage, ROCM_SMI: garbage})
    with pytest.raises(GpuSpecError) as info:
        discover(nvml=no_nvml(), run=run, environ={})
    message = str(info.value)
    for word in (
        "no GPU",
        "NVML",
        "nvidia-smi",
        "amd-smi",
        "rocm-smi",
        "--gpus sim:N",
        "--gpus 0,1",
    ):
        assert word in message
    assert info.value.exit_code == EXIT_BAD_INPUT


# -- visible-devices restriction
def smi_run() -> FakeRun:
    return FakeRun({NVIDIA_SMI: NVIDIA_SMI_OUT})


def test_cuda_visible_devices_restricts_auto_in_its_order() -> None:
    found = discover(nvml=no_nvml(), run=smi_run(), environ={"CUDA_VISIBLE_DEVICES": "2, 0"})
    assert found.ids == (2, 0)
    assert found.spec == "auto"


def test_cuda_visible_devices_accepts_uuid_prefixes() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-8932f937,0"}
    assert discover(nvml=no_nvml(), run=smi_run(), environ=env).ids == (1, 0)


def test_empty_cuda_visible_devices_counts_as_unset() -> None:
    found = discover(nvml=no_nvml(), run=smi_run(), environ={"CUDA_VISIBLE_DEVICES": " "})
    assert found.ids == (0, 1, 2)


@pytest.mark.parametrize("value", ["7", "0,MIG-1234", "-1", "GPU-"])
def test_unmappable_cuda_visible_devices_is_refused(value: str) -> None:
    with pytest.raises(GpuSpecError, match="CUDA_VISIBLE_DEVICES=") as info:
        discover(nvml=no_nvml(), run=smi_run(), environ={"CUDA_VISIBLE_DEVICES": value})
    assert "unset it" in str(info.value)


def test_rocr_visible_devices_restricts_amd_not_cuda_variable() -> None:
    run = FakeRun({ROCM_SMI: ROCM_SMI_OLD_OUT})
    env = {"ROCR_VISIBLE_DEVICES": "1,2", "CUDA_VISIBLE_DEVICES": "0"}
    assert discover(nvml=no_nvml(), run=run, environ=env).ids == (1, 2)


def test_discover_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert discover(nvml=no_nvml(), run=smi_run()).ids == (1,)


# -- the default tool runner
def test_run_tool_returns_stdout() -> None:
    assert run_tool(["echo", "hello", "$HOME"]) == "hello $HOME\n"  # no shell expansion


def test_run_tool_missing_failing_and_hanging_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_tool(["gpuswarm-no-such-tool-3f9a"]) is None
    assert run_tool(["false"]) is None
    monkeypatch.setattr(probes, "RUN_TIMEOUT_S", 0.2)
    assert run_tool(["sleep", "5"]) is None


# -- --gpus
def test_auto_uses_discovery() -> None:
    machine = h100s(2)
    assert parse_gpu_spec(" AUTO ", discover_fn=fixed(machine)) is machine


@pytest.mark.parametrize(("spec", "count"), [("sim:4", 4), ("SIM:1", 1), ("sim:1024", 1024)])
def test_sim_needs_no_discovery(spec: str, count: int) -> None:
    found = parse_gpu_spec(spec, discover_fn=no_discovery)
    assert found.vendor is Vendor.SIM
    assert found.ids == tuple(range(count))
    assert found.spec == f"sim:{count}"
    assert found.gpus[0] == Gpu(0, "sim", Vendor.SIM)


def test_sim_gpus_can_have_names() -> None:
    """``sim:2xA100,1xH100``: a simulated cluster of two GPU models (research compares each
    variant with the baseline of the model it ran on); the slots carry the names."""
    found = parse_gpu_spec("sim:2xA100, 1x H100", discover_fn=no_discovery)
    assert found.vendor is Vendor.SIM and found.spec == "sim:2xA100,1xH100"
    assert [(g.index, g.name) for g in found.gpus] == [(0, "A100"), (1, "A100"), (2, "H100")]
    assert found.describe() == "GPUs 0-2 (2x A100, 1x H100)"
    slots = plan_slots(found)
    assert [s.devices[0].name for s in slots] == ["A100", "A100", "H100"]
    assert parse_gpu_spec(found.spec, discover_fn=no_discovery) == found  # run.json's spec


@pytest.mark.parametrize("spec", ["sim:0xA100", "sim:2xA100,", "sim:2x", "sim:2xA100,3", "sim:x"])
def test_bad_named_sim_gpus_are_refused(spec: str) -> None:
    with pytest.raises(GpuSpecError, match=r"write NxNAME groups, e\.g\. --gpus sim:2xA100"):
        parse_gpu_spec(spec, discover_fn=no_discovery)


@pytest.mark.parametrize("spec", ["sim:0", "sim:abc", "sim:", "sim:1025", "sim:-1", "sim:2.5"])
def test_bad_sim_counts_are_refused(spec: str) -> None:
    with pytest.raises(GpuSpecError, match=r"from 1 to 1024, e\.g\. --gpus sim:4") as info:
        parse_gpu_spec(spec, discover_fn=no_discovery)
    assert spec in str(info.value)


@pytest.mark.parametrize(
    ("spec", "ids"),
    [
        ("0,1,2", (0, 1, 2)),
        ("0-3", (0, 1, 2, 3)),
        ("0,2-3", (0, 2, 3)),
        (" 3 , 1 ", (3, 1)),
        ("2-2", (2,)),
        ("1 - 2,0", (1, 2, 0)),
    ],
)
def test_explicit_ids_and_ranges_keep_the_order_given(spec: str, ids: tuple[int, ...]) -> None:
    found = parse_gpu_spec(spec, discover_fn=fixed(h100s(4)))
    assert found.ids == ids
    assert found.vendor is Vendor.NVIDIA
    assert found.spec == spec.strip()
    assert all(g.name == H100 for g in found.gpus)


@pytest.mark.parametrize(("spec", "dup"), [("0,1,1", 1), ("0-2,1", 1), ("3,0-3", 3), ("2,2", 2)])
def test_duplicates_are_refused(spec: str, dup: int) -> None:
    with pytest.raises(GpuSpecError, match=f"GPU {dup} is listed twice in --gpus {spec}"):
        parse_gpu_spec(spec, discover_fn=fixed(h100s(4)))


def test_unknown_id_names_the_machines_gpus() -> None:
    with pytest.raises(GpuSpecError) as info:
        parse_gpu_spec("0,9", discover_fn=fixed(h100s(4)))
    assert str(info.value) == (
        "--gpus 0,9: GPU 9 does not exist; this machine has GPUs 0-3 (NVIDIA H100 80GB HBM3)"
    )
    assert info.value.exit_code == EXIT_BAD_INPUT


def test_several_unknown_ids_and_mixed_models() -> None:
    machine = GpuSet(
        Vendor.NVIDIA,
        (Gpu(0, "A", Vendor.NVIDIA), Gpu(1, "A", Vendor.NVIDIA), Gpu(3, "B", Vendor.NVIDIA)),
        "auto",
    )
    with pytest.raises(GpuSpecError, match=r"GPUs 2, 8 do not exist; .* GPUs 0-1,3 \(2x A, 1x B\)"):
        parse_gpu_spec("0,2,8", discover_fn=fixed(machine))


def test_unknown_id_mentions_a_restricting_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(GpuSpecError, match=r"CUDA_VISIBLE_DEVICES=0,1 .* hides the others"):
        parse_gpu_spec("2", discover_fn=fixed(h100s(2)))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", "--gpus is empty"),
        ("   ", "--gpus is empty"),
        ("x", "'x', which is not a GPU id or range"),
        ("gpu0", "'gpu0', which is not a GPU id or range"),
        ("0,,1", "has an empty entry"),
        ("0,1,", "has an empty entry"),
        ("1-", "'1-', which is not"),
        ("-1", "'-1', which is not"),
        ("0;1", "'0;1', which is not"),
        ("3-1", "range 3-1 runs backwards; write 1-3"),
        ("0-100000", "range 0-100000 is larger than 1024 GPUs"),
    ],
)
def test_garbage_is_refused_with_the_accepted_forms(spec: str, expected: str) -> None:
    with pytest.raises(GpuSpecError) as info:
        parse_gpu_spec(spec, discover_fn=no_discovery)
    message = str(info.value)
    assert expected in message
    if "range" not in expected:
        assert "'auto'" in message and "'0-3'" in message and "'sim:N'" in message


def test_explicit_ids_propagate_a_failed_discovery() -> None:
    def nothing() -> GpuSet:
        return discover(nvml=no_nvml(), run=FakeRun(), environ={})

    with pytest.raises(GpuSpecError, match="no GPU was found"):
        parse_gpu_spec("0", discover_fn=nothing)


def test_format_ids() -> None:
    assert format_ids([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ids([3, 1]) == "3,1"
    assert format_ids([]) == ""


# -- slots
def sim(n: int) -> GpuSet:
    return parse_gpu_spec(f"sim:{n}", discover_fn=no_discovery)


def test_one_slot_per_gpu_by_default() -> None:
    slots = plan_slots(parse_gpu_spec("3,1", discover_fn=fixed(h100s(4))))
    assert slots == [Slot(0, (3,), Vendor.NVIDIA), Slot(1, (1,), Vendor.NVIDIA)]
    assert [s.label for s in slots] == ["gpu3", "gpu1"]


def test_gpus_per_task_groups_consecutive_gpus_in_order_given() -> None:
    slots = plan_slots(parse_gpu_spec("4-7,0-3", discover_fn=fixed(h100s(8))), gpus_per_task=2)
    assert [s.gpu_ids for s in slots] == [(4, 5), (6, 7), (0, 1), (2, 3)]
    assert [s.index for s in slots] == [0, 1, 2, 3]
    assert [s.label for s in slots] == ["gpu4+5", "gpu6+7", "gpu0+1", "gpu2+3"]


def test_tasks_per_gpu_interleaves_so_first_slots_cover_distinct_gpus() -> None:
    slots = plan_slots(sim(2), tasks_per_gpu=2)
    assert [(s.index, s.gpu_ids, s.share) for s in slots] == [
        (0, (0,), 0),
        (1, (1,), 0),
        (2, (0,), 1),
        (3, (1,), 1),
    ]
    assert [s.label for s in slots] == ["gpu0", "gpu1", "gpu0#1", "gpu1#1"]
    assert {s.vendor for s in slots} == {Vendor.SIM}


def test_both_knobs_together() -> None:
    slots = plan_slots(sim(4), gpus_per_task=2, tasks_per_gpu=3)
    assert [s.label for s in slots] == [
        "gpu0+1",
        "gpu2+3",
        "gpu0+1#1",
        "gpu2+3#1",
        "gpu0+1#2",
        "gpu2+3#2",
    ]
    assert [s.index for s in slots] == list(range(6))


def test_gpu_count_must_be_a_multiple_of_gpus_per_task() -> None:
    with pytest.raises(GpuSpecError) as info:
        plan_slots(sim(3), gpus_per_task=2)
    assert "gpus_per_task: 2 needs the GPU count (3: 0,1,2) to be a multiple of 2" in str(
        info.value
    )


@pytest.mark.parametrize(
    ("k", "m", "name"), [(0, 1, "gpus_per_task: 0"), (1, 0, "tasks_per_gpu: 0")]
)
def test_knobs_must_be_positive(k: int, m: int, name: str) -> None:
    with pytest.raises(GpuSpecError, match=f"{name} must be at least 1"):
        plan_slots(sim(2), gpus_per_task=k, tasks_per_gpu=m)


def test_empty_gpu_set_is_refused() -> None:
    with pytest.raises(GpuSpecError, match="selects no GPU"):
        plan_slots(GpuSet(Vendor.NVIDIA, (), "none"))


# -- isolation
def test_isolation_env_nvidia() -> None:
    assert isolation_env(Slot(1, (3,), Vendor.NVIDIA)) == {
        "CUDA_VISIBLE_DEVICES": "3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUSWARM_GPU_IDS": "3",
        "GPUSWARM_HOST_GPU_ID": "3",
        "GPUSWARM_SLOT": "1",
        "GPUSWARM_GPU_VENDOR": "nvidia",
    }


def test_isolation_env_nvidia_multi_gpu() -> None:
    assert isolation_env(Slot(2, (4, 5), Vendor.NVIDIA, share=1)) == {
        "CUDA_VISIBLE_DEVICES": "4,5",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUSWARM_GPU_IDS": "4,5",
        "GPUSWARM_HOST_GPU_ID": "4",
        "GPUSWARM_SLOT": "2",
        "GPUSWARM_GPU_VENDOR": "nvidia",
    }


def test_isolation_env_amd_masks_host_side_and_renumbers_from_zero() -> None:
    assert isolation_env(Slot(0, (5,), Vendor.AMD)) == {
        "ROCR_VISIBLE_DEVICES": "5",
        "HIP_VISIBLE_DEVICES": "0",
        "CUDA_VISIBLE_DEVICES": "0",
        "GPU_DEVICE_ORDINAL": "0",
        "GPUSWARM_GPU_IDS": "5",
        "GPUSWARM_HOST_GPU_ID": "5",
        "GPUSWARM_SLOT": "0",
        "GPUSWARM_GPU_VENDOR": "amd",
    }


def test_isolation_env_amd_multi_gpu() -> None:
    assert isolation_env(Slot(3, (2, 3, 6), Vendor.AMD)) == {
        "ROCR_VISIBLE_DEVICES": "2,3,6",
        "HIP_VISIBLE_DEVICES": "0,1,2",
        "CUDA_VISIBLE_DEVICES": "0,1,2",
        "GPU_DEVICE_ORDINAL": "0,1,2",
        "GPUSWARM_GPU_IDS": "2,3,6",
        "GPUSWARM_HOST_GPU_ID": "2",
        "GPUSWARM_SLOT": "3",
        "GPUSWARM_GPU_VENDOR": "amd",
    }


def test_isolation_env_sim() -> None:
    assert isolation_env(Slot(0, (0, 1), Vendor.SIM)) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUSWARM_GPU_IDS": "0,1",
        "GPUSWARM_HOST_GPU_ID": "0",
        "GPUSWARM_SLOT": "0",
        "GPUSWARM_GPU_VENDOR": "sim",
        "GPUSWARM_SIMULATED": "1",
    }


def test_isolation_env_subset_of_the_slots_gpus() -> None:
    env = isolation_env(Slot(1, (2, 3), Vendor.AMD), gpu_ids=[3])
    assert env["ROCR_VISIBLE_DEVICES"] == "3"
    assert env["HIP_VISIBLE_DEVICES"] == "0"
    assert env["GPUSWARM_HOST_GPU_ID"] == "3"
    assert (
        isolation_env(Slot(0, (2, 3), Vendor.NVIDIA), gpu_ids=(2,))["CUDA_VISIBLE_DEVICES"] == "2"
    )


@pytest.mark.parametrize("bad", [[], [4], [2, 2], [2, 4]])
def test_isolation_env_refuses_gpus_the_slot_does_not_own(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="not a non-empty subset of slot gpu2\\+3"):
        isolation_env(Slot(0, (2, 3), Vendor.NVIDIA), gpu_ids=bad)
