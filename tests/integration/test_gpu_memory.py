"""GPU memory through the real CLI (issue 19): measured peaks, packing by memory without
double-booking, waiting for room, OOM retry sizing, the release wait, MIG instances.

The GPUs are a fake NVML machine (tests/fakes/nvml/pynvml.py, first on the CLI's PYTHONPATH:
``--gpus auto`` discovers them as NVIDIA GPUs); the tasks are real processes
(tests/fakes/fake_gpu_task.py) that say what they hold on their ``CUDA_VISIBLE_DEVICES`` GPU, and
fail as a CUDA OOM would when what they allocate is not free (``--check-free``)."""

from __future__ import annotations

import csv
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_driver import find_runs, read_events, run_cli, start_cli, wait_for
from fakenvml import GPU_TASK, FakeMachine, gpu

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TASK = f"{shlex.quote(sys.executable)} {shlex.quote(str(GPU_TASK))}"


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[list[FakeMachine]]:
    made: list[FakeMachine] = []
    yield made
    for m in made:
        m.close()


def _machine(made: list[FakeMachine], tmp_path: Path, gpus: list[dict[str, Any]]) -> FakeMachine:
    m = FakeMachine(tmp_path / "nvml", gpus)
    made.append(m)
    return m


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gpumem.yaml"
    path.write_text("name: gpumem\nworkspace: ws\ngpus: auto\n" + body)
    return path


def _rows(run: Path) -> dict[str, dict[str, str]]:
    with (run / "results.tsv").open() as f:
        return {r["task"]: r for r in csv.DictReader(f, delimiter="\t")}


def _attempts(run: Path, state: str = "done") -> dict[str, list[dict[str, Any]]]:
    out = {}
    for path in (run / ".parallel" / state).glob("*.json"):
        desc = json.loads(path.read_text())
        out[desc["id"]] = desc["attempts"]
    return out


def _max_overlap(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = best = 0
    for _, step in edges:
        now += step
        best = max(best, now)
    return best


def test_each_attempt_s_peak_is_its_process_tree_s_and_mig_instances_are_gpus(
    tmp_path: Path, machines: list[FakeMachine]
) -> None:
    migs = [{"uuid": "MIG-fake-a", "memory_mb": 8192}, {"uuid": "MIG-fake-b", "memory_mb": 8192}]
    m = _machine(machines, tmp_path, [gpu(0, 16384, mig=migs), gpu(1, 16384)])
    m.foreign_process("GPU-fake-0001", 1000)  # someone else's job: never counted as ours
    cfg = _config(
        tmp_path,
        "tasks:\n"
        "  - matrix: {mb: [1000, 2000, 3000]}\n"
        '    name: "t{mb}"\n'
        f"    command: {TASK} --print-env --mb {{mb}} --hold 1.2 --children 1 --child-mb 100"
        " --grandchild\n",
    )
    res = run_cli("run", cfg, cwd=tmp_path, env=m.env())
    assert res.returncode == 0, res
    (run,) = find_runs(tmp_path / "ws")
    rows = _rows(run)
    # main + its child + its grandchild of 100 MiB each
    assert {t: r["peak_vram_mb"] for t, r in rows.items()} == {
        "t1000": "1200",
        "t2000": "2200",
        "t3000": "3200",
    }
    assert "peak GPU memory: max 3.1 GiB, median 2.1 GiB (3 of 3 tasks measured)" in res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["gpu_memory"]["measured"] == 3
    assert summary["gpu_memory"]["peak_vram_mb"]["max"] == 3200
    info = json.loads((run / "run.json").read_text())
    assert info["gpu_ids"] == [0, 1, 2]  # two MIG instances, then the whole GPU 1
    seen = set()
    for task in rows:
        log = (run / "tasks" / task / "attempt-1" / "output.log").read_text()
        seen.add(log.splitlines()[0])
    assert seen == {
        "CUDA_VISIBLE_DEVICES=MIG-fake-a",
        "CUDA_VISIBLE_DEVICES=MIG-fake-b",
        "CUDA_VISIBLE_DEVICES=2",
    }
    for attempts in _attempts(run).values():
        assert attempts[-1]["mean_vram_mb"] > 0
    assert "peak_vram_mb" in (run / "report.html").read_text()


def test_tasks_pack_by_memory_and_never_double_book(
    tmp_path: Path, machines: list[FakeMachine]
) -> None:
    m = _machine(machines, tmp_path, [gpu(0, 16384), gpu(1, 16384)])
    m.foreign_process("GPU-fake-0000", 5000)  # GPU 0 has room for one 6G task, GPU 1 for two
    cfg = _config(
        tmp_path,
        "tasks_per_gpu: 3\n"  # the slots would allow three on each: memory must refuse that
        "defaults: {gpu_memory: 6G}\n"
        "tasks:\n"
        "  - matrix: {i: [1, 2, 3, 4, 5, 6]}\n"
        '    name: "t{i}"\n'
        f"    command: {TASK} --mb 6000 --hold 0.8 --check-free\n",
    )
    res = run_cli("run", cfg, cwd=tmp_path, env=m.env())
    assert res.returncode == 0, res  # an over-booked GPU would have failed a task with an OOM
    (run,) = find_runs(tmp_path / "ws")
    per_gpu: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    for attempts in _attempts(run).values():
        (a,) = attempts
        assert a["peak_vram_mb"] == 6000 and not a["oom"]
        per_gpu[a["gpus"][0]].append((a["started"], a["ended"]))
    assert _max_overlap(per_gpu[0]) == 1
    assert _max_overlap(per_gpu[1]) == 2  # packed: two 6G tasks on one 16G GPU at once


def test_an_oom_retry_reserves_more_and_waits_for_a_gpu_with_room(
    tmp_path: Path, machines: list[FakeMachine]
) -> None:
    m = _machine(machines, tmp_path, [gpu(0, 6144), gpu(1, 16384)])
    stranger = m.foreign_process("GPU-fake-0001", 11000)  # GPU 1: 5.3G free, GPU 0: 6G
    cfg = _config(
        tmp_path,
        "reliability: {retry_backoff: null}\n"
        "tasks:\n"
        "  - name: grows\n"
        "    gpu_memory: 2G\n"
        "    max_attempts: 2\n"
        # attempt 1 grows 1.4, 2.8, 4.2, 5.6 GiB, then dies of a CUDA OOM; attempt 2 reaches 7G
        f"    command: {TASK} --mb 7000 --grow --hold 2.0 --oom-at 7000\n",
    )
    proc = start_cli("run", cfg, cwd=tmp_path, log_dir=tmp_path / "_cli", env=m.env())
    try:
        run = wait_for(lambda: find_runs(tmp_path / "ws"), 30)[0]
        first = wait_for(lambda: [e for e in read_events(run) if e["ev"] == "finished"], 30)[0]
        assert "the retry reserves" in first["reason"], first
        # 1.25 x 5.6 GiB fits neither GPU 0 (6 GiB in all) nor GPU 1 (5.3 GiB free): it waits
        wait = wait_for(lambda: [e for e in read_events(run) if e["ev"] == "gpu_wait"], 10)[0]
        assert wait["task"] == "grows" and wait["need_mb"] == 7000, wait
        assert "grows waits for 6.8 GiB of GPU memory" in wait["reason"]
        assert [e["ev"] for e in read_events(run)].count("started") == 1
        running = run / ".parallel" / "running"
        pending = run / ".parallel" / "pending"
        wait_for(lambda: not list(running.glob("[!.]*")) and list(pending.glob("*.json")), 10)
        status = run_cli("status", run, cwd=tmp_path, env=m.env())
        assert "waiting grows waits for 6.8 GiB of GPU memory" in status.output, status
        stranger.kill()  # room on GPU 1 now
        stranger.wait()
        res = proc.wait(60)
        assert res.returncode == 0, res
    finally:
        proc.kill_group()
    (a1, a2) = _attempts(run)["grows"]
    assert a1["oom"] and a1["gpus"] == [0] and a1["peak_vram_mb"] == 5600
    want = "the retry reserves 6.8 GiB of GPU memory (1.25x its measured peak of 5.5 GiB)"
    assert want in a1["reason"], a1
    assert a2["gpus"] == [1] and a2["peak_vram_mb"] == 7000 and not a2["oom"]
    desc = json.loads(next((run / ".parallel" / "done").glob("*.json")).read_text())
    assert desc["gpu_memory_mb"] == 7000
    assert "the retry reserves 6.8 GiB" in (run / "report.html").read_text()
    check = run_cli("check", run, cwd=tmp_path, env=m.env())
    assert check.returncode == 0, check  # the raised need and the events are a consistent run


def test_a_gpu_takes_the_next_task_only_once_released_and_a_held_one_is_skipped(
    tmp_path: Path, machines: list[FakeMachine]
) -> None:
    m = _machine(machines, tmp_path, [gpu(0, 16384), gpu(1, 16384)])
    cfg = _config(
        tmp_path,
        "reliability: {gpu_release_timeout: 1s}\n"
        "tasks:\n"
        "  - name: leaks\n"
        "    priority: 9\n"  # its memory is never freed (a leaked context of a dead pid)
        f"    command: {TASK} --mb 3000 --hold 0.8 --linger 600\n"
        "  - name: slow-free\n"
        "    priority: 8\n"  # the driver frees it 0.7 s after it ended
        f"    command: {TASK} --mb 3000 --hold 0.8 --linger 0.7\n"
        "  - matrix: {i: [1, 2, 3]}\n"
        '    name: "after{i}"\n'
        f"    command: {TASK} --mb 1000 --hold 0.3\n",
    )
    res = run_cli("run", cfg, cwd=tmp_path, env=m.env())
    assert res.returncode == 0, res
    (run,) = find_runs(tmp_path / "ws")
    done = _attempts(run)
    leaked = done["leaks"][0]["gpus"][0]
    events = read_events(run)
    held = [e for e in events if e["ev"] == "gpu_held"]
    assert [(e["gpu"], e["task"]) for e in held] == [(leaked, "leaks")]
    assert "skipped until it is freed" in held[0]["reason"]
    slow = done["slow-free"][0]
    free_gpu = slow["gpus"][0]
    assert free_gpu != leaked
    freed_at = slow["ended"] + 0.7  # the fake lists its pid until then
    for task in ("after1", "after2", "after3"):
        (a,) = done[task]
        assert a["gpus"] == [free_gpu], (task, a)  # never on the held GPU
        assert a["started"] >= freed_at - 0.2, (task, a, slow)  # not before its release
    status = run_cli("status", run, cwd=tmp_path, env=m.env())
    assert f"GPU {leaked} still holds" in status.output, status


def test_two_runs_started_together_on_one_gpu_never_double_book_it(
    tmp_path: Path, machines: list[FakeMachine]
) -> None:
    m = _machine(machines, tmp_path, [gpu(0, 16384)])  # room for two 6G tasks, not three
    procs = []
    for name in ("left", "right"):
        folder = tmp_path / name
        folder.mkdir()
        cfg = folder / "gpumem.yaml"
        cfg.write_text(
            f"name: {name}\nworkspace: ws\ngpus: auto\ntasks_per_gpu: 3\n"
            "defaults: {gpu_memory: 6G}\n"
            "tasks:\n"
            "  - matrix: {i: [1, 2, 3]}\n"
            '    name: "t{i}"\n'
            f"    command: {TASK} --mb 6000 --hold 0.8 --check-free\n"
        )
        procs.append(
            start_cli("run", cfg, "--share-gpus", cwd=folder, log_dir=folder / "_cli", env=m.env())
        )
    spans = []
    for proc, name in zip(procs, ("left", "right"), strict=True):
        res = proc.wait(60)
        assert res.returncode == 0, res  # a double-booked GPU fails a task with an OOM
        (run,) = find_runs(tmp_path / name / "ws")
        spans += [(a["started"], a["ended"]) for (a,) in _attempts(run).values()]
    assert len(spans) == 6
    assert _max_overlap(spans) == 2  # the two runs together: two at a time on the GPU


def test_simulated_gpus_with_a_memory_size_pack_a_command_list_by_gpu_memory(
    tmp_path: Path,
) -> None:
    res = run_cli(
        "run",
        "-",
        "--gpus",
        "sim:1@16G",
        "--gpu-memory",
        "6G",
        "--no-report",
        "-q",
        "--workspace",
        "ws",
        cwd=tmp_path,
        input="sleep 0.6\nsleep 0.6\nsleep 0.6\n",
    )
    assert res.returncode == 0, res
    (run,) = find_runs(tmp_path / "ws")
    info = json.loads((run / "run.json").read_text())
    assert info["slot_count"] == 2 and info["gpus"] == "sim:1@16G"  # 16 // 6 slots on the GPU
    spans = [(a["started"], a["ended"]) for (a,) in _attempts(run).values()]
    assert len(spans) == 3 and _max_overlap(spans) == 2
    assert all("peak_vram_mb" not in a for (a,) in _attempts(run).values())  # nothing measured
