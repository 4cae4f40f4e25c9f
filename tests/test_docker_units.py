"""The docker backend's pure parts: the exact ``docker run`` argument lists per vendor (a fake
sysfs tree for AMD's render nodes), the same-path binds and masks, and the docker: settings."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuswarm.config.models import RunConfig
from gpuswarm.core.errors import BackendError
from gpuswarm.exec.docker.argv import (
    Bind,
    RunArgs,
    container_name,
    masks_for,
    name_pattern,
    owner_key,
    run_argv,
    run_key,
    same_path_binds,
)
from gpuswarm.exec.docker.client import host_pids
from gpuswarm.exec.docker.devices import gpu_args, kfd_pci, render_node
from gpuswarm.exec.docker.settings import DockerConfig
from gpuswarm.placement.devices import Gpu, Vendor
from gpuswarm.placement.gpus import renumbered_env

NV0 = Gpu(0, "H100", Vendor.NVIDIA, uuid="GPU-aaaa")
NV1 = Gpu(1, "H100", Vendor.NVIDIA, uuid="GPU-bbbb")


# -- NVIDIA, CDI, none -------------------------------------------------------------------------
def test_nvidia_one_gpu_by_uuid() -> None:
    assert gpu_args("auto", Vendor.NVIDIA, [NV1]) == ["--gpus", '"device=GPU-bbbb"']


def test_nvidia_several_gpus_stay_one_csv_field() -> None:
    """Unquoted, docker reads ``device=0,1`` as ``device=0`` plus a stray field: one GPU."""
    args = gpu_args("nvidia", Vendor.NVIDIA, [NV0, NV1])
    assert args == ["--gpus", '"device=GPU-aaaa,GPU-bbbb"']


def test_nvidia_without_uuid_falls_back_to_the_index() -> None:
    assert gpu_args("auto", Vendor.NVIDIA, [Gpu(3, "x", Vendor.NVIDIA)]) == [
        "--gpus",
        '"device=3"',
    ]


def test_cdi_names_each_device() -> None:
    assert gpu_args("cdi", Vendor.NVIDIA, [NV0, NV1]) == [
        "--device",
        "nvidia.com/gpu=GPU-aaaa",
        "--device",
        "nvidia.com/gpu=GPU-bbbb",
    ]
    assert gpu_args("cdi", Vendor.AMD, [Gpu(2, "MI300", Vendor.AMD)]) == [
        "--device",
        "amd.com/gpu=2",
    ]


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_simulated_gpus_pass_no_device(mode: str) -> None:
    assert gpu_args(mode, Vendor.SIM, [Gpu(0, "sim", Vendor.SIM)]) == []
    assert gpu_args("none", Vendor.NVIDIA, [NV0]) == []


# -- AMD: /dev/kfd and the GPU's own render node, through sysfs --------------------------------
def fake_sysfs(root: Path, gpus: dict[str, str]) -> tuple[Path, Path]:
    """``/sys/bus/pci/devices/<bdf>/drm/renderD<N>`` for each ``bdf -> renderD<N>``, and a
    ``/dev`` with ``kfd`` and those nodes (plain files: their gid is ours)."""
    sysfs, dev = root / "sys", root / "dev"
    (dev / "dri").mkdir(parents=True)
    (dev / "kfd").write_text("")
    for bdf, node in gpus.items():
        drm = sysfs / "bus/pci/devices" / bdf / "drm"
        (drm / node).mkdir(parents=True)
        (drm / f"card{int(node.removeprefix('renderD')) - 128}").mkdir()
        (dev / "dri" / node).write_text("")
    return sysfs, dev


def kfd_node(sysfs: Path, n: int, *, simd: int, location: int = 0, domain: int = 0) -> None:
    node = sysfs / "class/kfd/kfd/topology/nodes" / str(n)
    node.mkdir(parents=True)
    (node / "properties").write_text(
        f"cpu_cores_count 0\nsimd_count {simd}\nlocation_id {location}\ndomain {domain}\n"
    )


def test_amd_render_node_comes_from_the_pci_address_not_128_plus_index(tmp_path: Path) -> None:
    # GPU 0 sits behind renderD130 (another DRM device took 128, the GPUs are in PCI order)
    sysfs, dev = fake_sysfs(tmp_path, {"0000:c1:00.0": "renderD130", "0000:05:00.0": "renderD131"})
    gpu = Gpu(0, "MI300X", Vendor.AMD, pci="0000:C1:00.0")
    assert render_node(gpu, sysfs=sysfs, dev=dev) == dev / "dri/renderD130"
    args = gpu_args("auto", Vendor.AMD, [gpu], sysfs=sysfs, dev=dev)
    gid = str(os.getgid())
    assert args == [
        "--device",
        str(dev / "kfd"),
        "--device",
        str(dev / "dri/renderD130"),
        "--group-add",
        gid,
    ]


def test_amd_without_a_pci_address_uses_the_kfd_topology_order(tmp_path: Path) -> None:
    sysfs, dev = fake_sysfs(tmp_path, {"0000:c1:00.0": "renderD129", "0001:05:01.2": "renderD128"})
    kfd_node(sysfs, 0, simd=0)  # the CPU node
    kfd_node(sysfs, 1, simd=304, location=0xC1 << 8)
    kfd_node(sysfs, 2, simd=304, location=(0x05 << 8) | (1 << 3) | 2, domain=1)
    assert kfd_pci(0, sysfs) == "0000:c1:00.0"
    assert kfd_pci(1, sysfs) == "0001:05:01.2"
    assert kfd_pci(2, sysfs) is None
    two = [Gpu(0, "MI300X", Vendor.AMD), Gpu(1, "MI300X", Vendor.AMD)]
    args = gpu_args("amd", Vendor.AMD, two, sysfs=sysfs, dev=dev)
    devices = [a for a in args if a.startswith(str(dev))]
    assert devices == [str(dev / "kfd"), str(dev / "dri/renderD129"), str(dev / "dri/renderD128")]


def test_amd_gpu_without_render_node_is_a_clear_error(tmp_path: Path) -> None:
    sysfs, dev = fake_sysfs(tmp_path, {})
    with pytest.raises(BackendError, match="no PCI address"):
        gpu_args("amd", Vendor.AMD, [Gpu(0, "MI300X", Vendor.AMD)], sysfs=sysfs, dev=dev)
    gpu = Gpu(0, "MI300X", Vendor.AMD, pci="0000:c1:00.0")
    with pytest.raises(BackendError, match="no render node"):
        gpu_args("amd", Vendor.AMD, [gpu], sysfs=sysfs, dev=dev)


def test_inside_the_container_the_gpus_are_renumbered() -> None:
    assert renumbered_env(Vendor.NVIDIA, 2) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HIP_VISIBLE_DEVICES": "0,1",
        "GPU_DEVICE_ORDINAL": "0,1",
    }
    assert renumbered_env(Vendor.AMD, 1)["ROCR_VISIBLE_DEVICES"] == "0"


# -- the whole docker run ----------------------------------------------------------------------
def test_run_argv_is_exact_and_carries_no_env_value(tmp_path: Path) -> None:
    args = RunArgs(
        image="img:1",
        name="gpuswarm-r-t-1-abc",
        user="1000:1000",
        workdir=Path("/w/run/tasks/t"),
        command=["python", "train.py", "--lr", "0.1"],
        labels={"run": "/w/run", "task": "t", "attempt": "1"},
        env_names=["HOME", "API_KEY", "HOME"],
        binds=[Bind(Path("/w/run/tasks/t")), Bind(Path("/data"), Path("/d"), read_only=True)],
        masks=[Path("/w/run/.parallel")],
        devices=["--gpus", '"device=GPU-a"'],
        network="none",
        shm_size="16g",
        extra=["--cap-add=SYS_PTRACE"],
    )
    assert run_argv("docker", args) == [
        "docker", "run", "--name", "gpuswarm-r-t-1-abc", "--init", "--log-driver", "none",
        "--pull", "never", "--user", "1000:1000", "--workdir", "/w/run/tasks/t",
        "--label", "gpuswarm.attempt=1", "--label", "gpuswarm.run=/w/run",
        "--label", "gpuswarm.task=t",
        "--env", "API_KEY", "--env", "HOME",
        "--mount", "type=bind,source=/w/run/tasks/t,destination=/w/run/tasks/t",
        "--mount", "type=bind,source=/data,destination=/d,readonly",
        "--mount", "type=tmpfs,destination=/w/run/.parallel",
        "--network", "none", "--shm-size", "16g",
        "--gpus", '"device=GPU-a"', "--cap-add=SYS_PTRACE",
        "img:1", "python", "train.py", "--lr", "0.1",
    ]  # fmt: skip


def test_a_path_with_a_comma_is_one_csv_field_of_mount() -> None:
    args = RunArgs("i", "n", "0:0", Path("/"), ["true"], {}, [], binds=[Bind(Path("/a,b"))])
    mount = run_argv("docker", args)[run_argv("docker", args).index("--mount") + 1]
    assert mount == 'type=bind,"source=/a,b","destination=/a,b"'


def test_container_names_are_docker_safe_and_carry_the_run_and_owner_keys() -> None:
    name = container_name("run_2026 x/gpumode softmax/3", "ab12", run_dir="/r/x", owner="h:1:2")
    keys = f"{run_key('/r/x')}-{owner_key('h:1:2')}"
    assert re.fullmatch(r"[0-9a-f]{12}-[0-9a-f]{8}", keys)
    assert name == f"gpuswarm-{keys}-run_2026-x-gpumode-softmax-3-ab12"
    assert re.match(name_pattern(run_dir="/r/x"), name)
    assert re.match(name_pattern(owner="h:1:2"), name)
    assert re.match(name_pattern(run_dir="/r/x", owner="h:1:2"), name)
    assert not re.match(name_pattern(run_dir="/r/y"), name)
    assert not re.match(name_pattern(owner="h:1:3"), name)


def test_same_path_binds_drop_folders_inside_another() -> None:
    got = same_path_binds([Path("/r/tasks/t"), Path("/r"), Path("/r/homes/s"), Path("/x")])
    assert got == [Bind(Path("/r")), Bind(Path("/x"))]


def test_the_queue_and_other_homes_are_masked_where_a_bind_reaches_them() -> None:
    run = Path("/base/runs/x/run_1")
    own_home = run / "homes/h-gpu0"
    same = [Bind(run / "tasks/t"), Bind(own_home)]
    assert masks_for(run, same, [own_home]) == []
    assert masks_for(run, [Bind(Path("/base"))], [own_home]) == [run / ".parallel", run / "homes"]


def test_the_queue_is_masked_where_a_mount_shows_it_under_another_path() -> None:
    """Issue 30: ``mounts: [{src: /, dest: /host}]`` showed the queue at /host<run>/.parallel
    (the mask was put at the host path only)."""
    run = Path("/base/runs/x/run_1")
    host = Path("/host") / run.relative_to("/")
    got = masks_for(run, [Bind(Path("/"), Path("/host"))], [])
    assert got == [host / ".parallel", host / "homes"]
    got = masks_for(run, [Bind(run, Path("/r"), read_only=True)], [])
    assert got == [Path("/r/.parallel"), Path("/r/homes")]
    assert masks_for(run, [Bind(run / "tasks", Path("/t"))], []) == []


def test_masks_follow_a_mount_source_that_is_a_symlink(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "x" / "run_1"
    run.mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "runs")  # docker mounts what the link leads to
    got = masks_for(run, [Bind(tmp_path / "link", Path("/data"))], [])
    assert got == [Path("/data/x/run_1/.parallel"), Path("/data/x/run_1/homes")]


# -- the docker: settings ----------------------------------------------------------------------
def config(**docker: object) -> dict[str, object]:
    return {"backend": "docker", "docker": {"image": "i:1", **docker}, "tasks": [{"command": "x"}]}


@pytest.mark.parametrize(
    ("docker", "message"),
    [
        ({"args": ["-v", "/a:/b"]}, "give host folders in docker.mounts"),
        ({"args": ["--volume=/a:/b"]}, "give host folders in docker.mounts"),
        ({"args": ["-e", "X=1"]}, "docker.pass_env"),
        ({"args": ["--rm"]}, "gpuswarm sets it itself"),
        ({"args": ["--hostname=ghp_" + "a" * 36]}, "secret"),
        ({"mounts": [{"src": "/a", "dest": "relative"}]}, "absolute path"),
        ({"shm_size": "lots"}, "is not a size"),
        ({"gpu_flags": "rocm"}, "auto"),
        ({"pass_env": ["1BAD"]}, "1BAD"),
    ],
)
def test_bad_docker_settings_name_the_fix(docker: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RunConfig.model_validate(config(**docker))


def test_backend_and_block_go_together() -> None:
    with pytest.raises(ValidationError, match="needs a docker: block"):
        RunConfig.model_validate({"backend": "docker", "tasks": [{"command": "x"}]})
    with pytest.raises(ValidationError, match="add backend: docker"):
        RunConfig.model_validate({"docker": {"image": "i"}, "tasks": [{"command": "x"}]})
    cfg = RunConfig.model_validate(config(mounts=[{"src": "/a", "dest": "/a"}]))
    assert isinstance(cfg.docker, DockerConfig) and cfg.docker.mounts[0].read_only is False


def test_a_container_in_the_hosts_pid_namespace_has_no_host_pids_to_signal() -> None:
    """A container sharing this process's pid namespace (``--pid host``, refused in args since
    issue 30): "every process of its namespace" would be every process of the host."""
    assert host_pids(os.getpid()) == []
    assert host_pids(1 << 30) == []  # no such process
