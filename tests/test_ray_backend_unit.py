"""The ray backend's pure parts (no cluster): the config block, ``--gpus`` under Ray, the wire
format and a node's staging of an attempt, what comes home and its limit; and that a local
run never imports ray."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpuswarm.config.models import RunConfig
from gpuswarm.core.errors import GpuSpecError
from gpuswarm.exec.base import LaunchSpec, backend_names, membership_of
from gpuswarm.exec.ray.cluster import GpuFilter, Node, parse_filter
from gpuswarm.exec.ray.settings import RayConfig
from gpuswarm.exec.ray.slots import slot_label
from gpuswarm.exec.ray.wire import (
    PROBE_NAME,
    TooLarge,
    collect_outputs,
    node_spec,
    pack_tree,
    unpack_tree,
    wire,
    write_outputs,
)


def test_ray_config_block_and_addresses() -> None:
    assert RayConfig().address == "auto"
    for ok in ("auto", "10.0.0.1:6379", "head.example:6379", "ray://head:10001"):
        assert RayConfig(address=ok).address == ok
    with pytest.raises(ValidationError, match="HOST:PORT"):
        RayConfig(address="head")
    with pytest.raises(ValidationError, match="add backend: ray"):
        RunConfig.model_validate({"tasks": [{"command": "true"}], "ray": {"address": "auto"}})
    cfg = RunConfig.model_validate({"tasks": [{"command": "true"}], "backend": "ray"})
    assert cfg.ray is None and "ray" in backend_names()


def _node(host: str = "a", node_id: str = "abcdef0123", **labels: str) -> Node:
    return Node(node_id, host, "10.0.0.5", 2, "GPU", labels, {"GPU": 2.0, "fast": 1.0})


def test_gpus_under_ray_is_a_filter() -> None:
    assert parse_filter(None) == GpuFilter() == parse_filter("auto") == parse_filter("all")
    assert parse_filter("4").count == 4
    assert parse_filter("node:a,b").admits(_node("b"))
    assert not parse_filter("node:a").admits(_node("c"))
    assert parse_filter("node:abcdef").admits(_node("x"))  # a node id prefix
    assert parse_filter("node:10.0.0.5").admits(_node("x"))
    assert parse_filter("label:zone=eu").admits(_node(zone="eu"))
    assert not parse_filter("label:zone=eu").admits(_node(zone="us"))
    assert parse_filter("label:fast").admits(_node())  # a custom resource
    for bad in ("0", "node:", "label:=x", "sim:4", "0-3"):
        with pytest.raises(GpuSpecError, match="--gpus"):
            parse_filter(bad)


def test_slot_labels_name_host_node_and_gpu() -> None:
    assert slot_label("dgx-1", "0123456789", (3,), 0) == "dgx-1-012345-gpu3"
    assert slot_label("dgx-1", "0123456789", (0, 1), 0) == "dgx-1-012345-gpu0+1"
    assert slot_label("dgx-1", "0123456789", (3,), 1) == "dgx-1-012345-gpu3.1"


def test_local_backend_has_no_membership() -> None:
    from gpuswarm.exec.base import create_backend

    assert membership_of(create_backend("local")) is None


def _spec(root: Path, cwd: Path) -> LaunchSpec:
    task_dir = root / "tasks" / "t1"
    env = {
        "PATH": "/driver/bin",
        "GPUSWARM_RUN_DIR": str(root),
        "GPUSWARM_TASK_WORKSPACE": str(task_dir),
        "CUDA_VISIBLE_DEVICES": "1",
        "MINE": "x",
    }
    return LaunchSpec(
        argv=["python", f"{cwd}/train.py", "--out", f"{task_dir}/result.json"],
        env=env,
        cwd=cwd,
        log_path=task_dir / "attempt-1" / "output.log",
        token="run/t1/1",
        own_env=frozenset({"MINE"}),
        identity={"kind": "attempt", "task": "t1", "attempt": "1", "slot": "s"},
    )


def test_node_runs_in_place_when_it_sees_the_run_folder(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / ".parallel").mkdir(parents=True)
    (root / ".parallel" / PROBE_NAME).write_text("nonce")
    data = wire(_spec(root, tmp_path), root=str(root), probe="nonce", ship="auto")
    assert "PATH" not in data["env"] and data["env"]["MINE"] == "x"  # the node's PATH there
    assert data["env"]["CUDA_VISIBLE_DEVICES"] == "1"  # its GPUs always travel
    staged = node_spec(data, {"PATH": "/node/bin", "RAY_X": "1"}, tmp_path / "scratch", None)
    assert staged.stage is None and staged.spec.cwd == tmp_path
    assert staged.spec.env["PATH"] == "/node/bin" and "RAY_X" not in staged.spec.env
    assert staged.spec.log_path.parent == tmp_path / "scratch" / "logs"  # pulled from there


def test_node_without_the_run_folder_runs_in_a_stage(tmp_path: Path) -> None:
    root = tmp_path / "run"
    cwd = tmp_path / "variant"
    data = wire(_spec(root, cwd), root=str(root), probe="nonce", ship="auto", tree=("k", str(cwd)))
    shipped = tmp_path / "trees" / "k"
    staged = node_spec(data, {}, tmp_path / "scratch", shipped)
    assert staged.stage is not None and staged.task_dir is not None
    stage = str(staged.stage)
    assert staged.spec.cwd == shipped
    out = f"{stage}/tasks/t1/result.json"
    assert staged.spec.argv == ["python", f"{shipped}/train.py", "--out", out]
    assert staged.spec.env["GPUSWARM_TASK_WORKSPACE"] == f"{stage}/tasks/t1"
    assert staged.task_dir.is_dir()


def test_shipped_tree_keeps_links_and_outputs_come_home_bounded(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    (src / "data").symlink_to("/shared/data")
    key, blob = pack_tree(src, 1 << 20)
    dest = tmp_path / "node" / key
    dest.parent.mkdir()
    unpack_tree(blob, dest)
    assert (dest / "train.py").read_text() == "print(1)\n"
    assert str((dest / "data").readlink()) == "/shared/data"
    with pytest.raises(TooLarge, match="max_ship_mb"):
        (src / "big").write_bytes(os.urandom(64 << 10))
        pack_tree(src, 32 << 10)

    staged = tmp_path / "staged"
    (staged / "attempt-1").mkdir(parents=True)
    (staged / "attempt-1" / "output.log").write_text("not sent")
    (staged / "out").mkdir()
    (staged / "out" / "result.json").write_text('{"ok": true}')
    (staged / "link").symlink_to("/etc/passwd")
    files = collect_outputs(staged, 1 << 20)
    assert files == [("out/result.json", b'{"ok": true}')]
    with pytest.raises(TooLarge, match="max_result_mb"):
        collect_outputs(staged, 4)
    home = tmp_path / "home"
    home.mkdir()
    evil = [("../escape", b"x"), ("/abs", b"x"), ("attempt-1/output.log", b"x")]
    assert write_outputs(home, [*files, *evil]) == ["out/result.json"]
    assert (home / "out" / "result.json").read_text() == '{"ok": true}'
    assert not (tmp_path / "escape").exists()


@pytest.mark.slow
def test_a_local_run_never_imports_ray(tmp_path: Path) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("true\n")
    code = textwrap.dedent(
        f"""
        import sys
        from gpuswarm.cli import cli
        try:
            cli(["run", "--gpus", "sim:1", "--plain", "--no-report", "-q",
                  "--workspace", {str(tmp_path / "ws")!r}, {str(cmds)!r}])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        assert "ray" not in sys.modules, "backend: local imported ray"
        print("no ray")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0 and "no ray" in out.stdout, out.stdout + out.stderr


def test_run_view_follows_a_cluster_s_slots() -> None:
    from gpuswarm.core.runview import RunView

    view = RunView({"pending": 1, "running": 0})
    view.apply({"ev": "supervisor_started", "slots": ["a-111111-gpu0"], "ts": 1.0})
    view.apply({"ev": "slots", "change": "joined", "slots": ["b-222222-gpu0", "b-222222-gpu1"]})
    assert sorted(view.slots) == ["a-111111-gpu0", "b-222222-gpu0", "b-222222-gpu1"]
    view.apply({"ev": "started", "task": "t", "attempt": 1, "slot": "b-222222-gpu1", "ts": 2.0})
    view.apply({"ev": "slots", "change": "left", "slots": ["b-222222-gpu0", "b-222222-gpu1"]})
    assert sorted(view.slots) == ["a-111111-gpu0", "b-222222-gpu1"]  # its attempt ends lost


def test_the_node_s_copy_of_a_log_is_freed_once_delivered(tmp_path: Path) -> None:
    from gpuswarm.exec.ray.actor import punch_hole

    log = tmp_path / "log"
    log.write_bytes(b"x" * (1 << 20) + b"tail")
    with log.open("r+b") as fh:
        freed = punch_hole(fh.fileno(), (1 << 20) + 3)
    if freed == 0:
        pytest.skip("this filesystem cannot punch holes")
    assert freed == 1 << 20 and log.stat().st_size == (1 << 20) + 4  # offsets stay
    assert log.stat().st_blocks * 512 < 1 << 19  # the delivered megabyte is off the disk
    assert log.read_bytes()[-4:] == b"tail"


@pytest.mark.slow
def test_run_on_a_cluster_that_is_not_there_is_bad_input(tmp_path: Path) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text("true\n")
    out = subprocess.run(
        [sys.executable, "-m", "gpuswarm", "run", "--backend", "ray", "--ray-address",
         "127.0.0.1:1", "--workspace", str(tmp_path / "ws"), str(cmds)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--ray-address" in out.stderr and "127.0.0.1:1" in out.stderr
    assert not (tmp_path / "ws").exists()  # nothing was made


def test_resume_on_another_cluster_address() -> None:
    from gpuswarm.app.setup import Setup, with_backend_options
    from gpuswarm.core.errors import ConfigError

    def with_ray_address(setup: Setup, address: str) -> Setup:  # resume --ray-address
        return with_backend_options(setup, "resume", {"ray_address": address})

    ray_setup = Setup(
        [], Path(), False, (), {}, backend="ray", backend_settings=RayConfig(ship="always")
    )
    moved = with_ray_address(ray_setup, "10.0.0.9:6379")
    assert moved.ray == RayConfig(address="10.0.0.9:6379", ship="always")
    with pytest.raises(ConfigError, match="--ray-address"):
        with_ray_address(ray_setup, "nohost")
    with pytest.raises(ConfigError, match="not ray"):
        with_ray_address(Setup([], Path(), False, (), {}), "10.0.0.9:6379")


def test_a_task_lost_three_times_in_a_row_is_judged_not_requeued() -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from gpuswarm.core.models import AttemptRecord, Descriptor, EndKind
    from gpuswarm.exec.base import AttemptEnd
    from gpuswarm.supervise.committer import _lost_again

    lost = AttemptEnd(EndKind.LOST, None, None, "lost: node left", False, 0.0, 1.0, None, 0)

    def live(kinds: list[EndKind]) -> Any:
        records = [AttemptRecord.lost(n=i + 1, slot="s", reason="x") for i, _ in enumerate(kinds)]
        records = [r.but(kind=k.value) for r, k in zip(records, kinds, strict=True)]
        desc = Descriptor({"attempts": [r.to_json() for r in records]})
        return cast(Any, SimpleNamespace(claimed=SimpleNamespace(desc=desc)))

    assert _lost_again(live([]), lost)
    assert _lost_again(live([EndKind.LOST]), lost)
    assert _lost_again(live([EndKind.LOST, EndKind.EXITED]), lost)
    assert not _lost_again(live([EndKind.LOST, EndKind.LOST]), lost)  # the third in a row
    exited = AttemptEnd(EndKind.EXITED, 0, None, "exit 0", False, 0.0, 1.0, 1, 0)
    assert not _lost_again(live([]), exited)


class _NoCluster:
    """Stands for the ``ray`` module where only the runtime context is asked."""

    def __init__(self, gcs: str) -> None:
        self.gcs = gcs

    def get_runtime_context(self) -> object:
        return type("Ctx", (), {"gcs_address": self.gcs})()


def test_the_head_probed_is_the_client_server_of_a_ray_url_else_the_gcs() -> None:
    from gpuswarm.exec.ray.slots import head_address

    assert head_address(_NoCluster("10.0.0.1:6379"), "auto") == ("10.0.0.1", 6379)
    # Ray Client: the GCS is the cluster's, maybe out of reach; its server is what answers us
    assert head_address(_NoCluster("10.9.9.9:6379"), "ray://head.example:10001") == (
        "head.example",
        10001,
    )
    assert head_address(_NoCluster(""), "10.0.0.2:6380") == ("10.0.0.2", 6380)
    assert head_address(_NoCluster(""), "auto") is None  # not known: Ray's own check only


def test_a_head_that_stops_answering_is_fatal_after_head_timeout() -> None:
    """A real listening socket plays the head's GCS port; once it is closed, the watch of the
    head declares every node's attempts lost, retires every slot and reports ``fatal``."""
    import socket
    import threading

    from gpuswarm.exec.ray.slots import RaySlot, SlotPool
    from gpuswarm.placement.devices import Vendor
    from gpuswarm.placement.gpus import Slot

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    pool = SlotPool(
        None,
        RayConfig(head_timeout=0.5),
        "run-1",
        gpus_per_task=1,
        tasks_per_gpu=1,
        gpu_filter=GpuFilter(),
        max_result=1 << 20,
    )
    node = _node("b", "nodeb12345")
    slot = Slot(0, (0,), Vendor.NVIDIA, ident="b-nodeb1-gpu0")
    pool.by_label[slot.label] = RaySlot(slot, node, object(), "gpuswarm/run-1/nodeb/0")
    pool.nodes[node.node_id] = node
    watcher = threading.Thread(target=pool._watch_head, args=(("127.0.0.1", port),))
    watcher.start()
    try:
        time.sleep(1.5)  # answering: nothing happens
        assert pool.lost is None and not pool.changes()
        server.close()  # the head is gone
        watcher.join(15)
        assert not watcher.is_alive()
    finally:
        pool._stop.set()
        server.close()
    assert pool.lost is not None and "stopped answering" in pool.lost
    assert pool.node_dead(node.node_id) == f"the Ray head at 127.0.0.1:{port} is gone"
    changes = pool.changes()
    assert changes.fatal == pool.lost and changes.retired == [slot.label]
    assert pool.get(slot.label) is None


class _Ref:
    def __init__(self, value: object) -> None:
        self.value = value


class _FakeActor:
    def __init__(self, host: str, gpu: int) -> None:
        info = {"host": host, "node": "", "gpus": [gpu], "pid": 1}
        self.info = type("M", (), {"remote": staticmethod(lambda: _Ref(info))})()


class _FakeRay:
    """The slice of ``ray`` the slot pool uses, over a node list the test edits: actors are
    made at once, each given the next GPU of its node."""

    def __init__(self, listed: list[dict[str, object]]) -> None:
        self.listed = listed
        self.next_gpu: dict[str, int] = {}

    def nodes(self) -> list[dict[str, object]]:
        return self.listed

    def remote(self, cls: object) -> object:
        fake = self

        class Options:
            def __init__(self, **kw: object) -> None:
                strategy: Any = kw["scheduling_strategy"]
                self.node = str(strategy.node_id)

            def remote(self, *args: object) -> _FakeActor:
                gpu = fake.next_gpu.get(self.node, 0)
                fake.next_gpu[self.node] = gpu + 1
                host = next(
                    str(n["NodeManagerHostname"]) for n in fake.listed if n["NodeID"] == self.node
                )
                return _FakeActor(host, gpu)

        return type("Cls", (), {"options": staticmethod(lambda **kw: Options(**kw))})()

    def wait(self, refs: list[_Ref], **kw: object) -> tuple[list[_Ref], list[_Ref]]:
        return refs, []

    def get(self, ref: _Ref, timeout: float | None = None) -> object:
        return ref.value

    def kill(self, actor: object, no_restart: bool = True) -> None:
        pass


def _listed(host: str, node_id: str) -> dict[str, object]:
    return {
        "NodeID": node_id,
        "Alive": True,
        "NodeManagerHostname": host,
        "NodeManagerAddress": "10.0.0.9",
        "Resources": {"GPU": 2.0},
    }


def test_gpus_n_gives_a_waiting_node_the_gpus_a_dead_node_freed() -> None:
    """``--gpus 2`` on a cluster of two 2-GPU nodes: the first node's slots; when it dies the
    other node (skipped while the count was reached) gets them. With every node gone the
    pool may grow again (a joining node gets slots); with a live node of its own, not."""
    pytest.importorskip("ray")
    from gpuswarm.exec.ray.slots import SlotPool

    a, b = _listed("a", "a" * 56), _listed("b", "b" * 56)  # 28-byte hex ids, as Ray makes
    fake = _FakeRay([a, b])
    pool = SlotPool(
        fake,
        RayConfig(),
        "run-1",
        gpus_per_task=1,
        tasks_per_gpu=1,
        gpu_filter=parse_filter("2"),
        max_result=1 << 20,
    )
    first = pool.initial_slots()
    assert sorted(s.label for s in first) == ["a-aaaaaa-gpu0", "a-aaaaaa-gpu1"]
    assert not pool.may_grow()
    fake.listed = [b]  # node a dies
    assert pool._look()
    changes = pool.changes()
    assert sorted(changes.retired) == ["a-aaaaaa-gpu0", "a-aaaaaa-gpu1"]
    assert sorted(s.label for s in changes.added) == ["b-bbbbbb-gpu0", "b-bbbbbb-gpu1"]
    fake.listed = []  # and b: nothing of the run's is alive, a node that joins gets slots
    pool._look()
    assert pool.may_grow()


def test_ray_messages_go_to_the_run_s_ray_log_private_redacted_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the Ray driver's error listener prints (on stdout, where --json goes): the run's
    ray.log instead, 0600, without colour codes or secrets, never past its bound."""
    from gpuswarm.exec.ray import messages

    log = tmp_path / "ray.log"
    messages.send_to(log)
    try:
        messages.write(
            {
                "lines": ["\x1b[33mRaylet\x1b[0m is terminated", "TOKEN=hunter2secret"],
                "pid": "raylet",
                "is_err": False,
            }
        )
        text = log.read_text()
        assert "(raylet) Raylet is terminated\n" in text and "hunter2secret" not in text
        assert log.stat().st_mode & 0o777 == 0o600
        monkeypatch.setattr(messages, "MAX_BYTES", len(text.encode()) + 10)
        messages.write({"lines": ["x" * 100], "pid": "raylet"})
        assert len(log.read_bytes()) == len(text.encode()) + 10  # cut at the bound
        messages.write({"lines": ["more"], "pid": "raylet"})
        assert len(log.read_bytes()) == len(text.encode()) + 10
        messages.write({"lines": ["Resources", " 2.0/6.0 GPU"], "pid": "autoscaler"})
        assert "GPU" not in log.read_text()  # the autoscaler's periodic status: not kept
        link = tmp_path / "link.log"
        link.symlink_to(tmp_path / "elsewhere")
        messages.send_to(link)
        messages.write({"lines": ["never followed"], "pid": "raylet"})
        assert not (tmp_path / "elsewhere").exists()
    finally:
        messages.send_to(None)
    assert capsys.readouterr().out == ""  # nothing on stdout


def test_ray_messages_printer_is_replaced_on_the_connected_driver() -> None:
    from types import SimpleNamespace

    from gpuswarm.exec.ray import messages

    worker = SimpleNamespace(print_to_stdstream=print)
    fake = SimpleNamespace(_private=SimpleNamespace(worker=worker))
    assert messages.install(fake) and worker.print_to_stdstream is messages.write
    assert not messages.install(SimpleNamespace())
