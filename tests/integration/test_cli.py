"""End-to-end tests of the real ``gpuswarm`` CLI, run in subprocesses on simulated GPUs.

Every test drives ``python -m gpuswarm`` and judges it by what it leaves on disk (run folders,
files the tasks write about themselves, results.tsv, summary.json, events.jsonl) and what it
prints. Tasks are small Python or shell commands that record their own environment, so GPU
isolation, placeholders and env handling are proven by what the tasks actually saw.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuswarm.store.leases import host_slug

pytestmark = pytest.mark.slow

PY = sys.executable
CLI_TIMEOUT = 90
_DROP_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "COLUMNS",
    "LINES",
)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# A task that records what it saw: its environment, times, cwd, argv, and the modes of HOME and
# of a provisioned file. Usage: probe.py OUT_JSON [SLEEP_SECONDS]
PROBE = r"""
import json, os, stat, sys, time
out = sys.argv[1]
start = time.time()
time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
info = {"env": dict(os.environ), "cwd": os.getcwd(), "argv": sys.argv[1:], "start": start}
home = os.environ.get("HOME", "")
if home and os.path.isdir(home):
    info["home_mode"] = stat.S_IMODE(os.stat(home).st_mode)
auth = os.path.join(home, ".codex", "auth.json")
if os.path.exists(auth):
    info["auth_mode"] = stat.S_IMODE(os.stat(auth).st_mode)
    with open(auth) as fh:
        info["auth_text"] = fh.read()
info["end"] = time.time()
tmp = out + ".tmp"
with open(tmp, "w") as fh:
    json.dump(info, fh)
os.replace(tmp, out)
"""


# -- helpers ---------------------------------------------------------------------------------------
def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in _DROP_ENV and not k.startswith("GPUSWARM_")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def gs(
    *args: object, cwd: Path, stdin: str | None = None, timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gpuswarm ARGS`` in ``cwd`` and capture its output."""
    return subprocess.run(
        [PY, "-m", "gpuswarm", *(str(a) for a in args)],
        cwd=cwd,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        check=False,
    )


def show(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=1000))
    return path


def write_probe(folder: Path) -> Path:
    path = folder / "probe.py"
    path.write_text(PROBE)
    return path


def runs_under(workspace: Path) -> list[Path]:
    return sorted(p for p in workspace.glob("*/run_*") if p.is_dir())


def only_run(workspace: Path) -> Path:
    runs = runs_under(workspace)
    assert len(runs) == 1, f"expected one run under {workspace}, found {runs}"
    return runs[0]


def results(run: Path) -> dict[str, dict[str, str]]:
    with (run / "results.tsv").open(newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return {row["task"]: row for row in rows}


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line]


def summary(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "summary.json").read_text())
    return data


def task_json(run: Path, task_id: str, name: str = "env.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "tasks" / task_id / name).read_text())
    return data


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["start"] < b["end"] and b["start"] < a["end"])


def max_concurrency(intervals: Iterable[dict[str, Any]]) -> int:
    points = sorted(
        [(i["start"], 1) for i in intervals] + [(i["end"], -1) for i in intervals],
        key=lambda p: (p[0], p[1]),
    )
    best = now = 0
    for _, delta in points:
        now += delta
        best = max(best, now)
    return best


def gpu_tools_present() -> bool:
    """Whether ``--gpus auto`` would find a GPU here (then '0,99' is judged differently)."""
    from gpuswarm.core.errors import GpuSpecError
    from gpuswarm.placement.gpus import discover

    try:
        discover(environ={})
    except GpuSpecError:
        return False
    return True


# == 1. GPU isolation, proven by the tasks themselves ==============================================
def test_each_task_sees_exactly_one_gpu_and_concurrent_tasks_never_share(tmp_path: Path) -> None:
    probe = write_probe(tmp_path)
    cfg = write_yaml(
        tmp_path / "iso.yaml",
        {
            "name": "iso",
            "tasks": [
                {
                    "matrix": {"i": list(range(8))},
                    "name": "t{i}",
                    "command": [PY, str(probe), "{workspace}/env.json", "1.0"],
                }
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:4", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    seen = {}
    for i in range(8):
        info = task_json(run, f"t{i}")
        env = info["env"]
        cvd = env["CUDA_VISIBLE_DEVICES"]
        assert cvd in {"0", "1", "2", "3"}, cvd
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["GPUSWARM_TASK_ID"] == f"t{i}"
        assert Path(env["GPUSWARM_RUN_DIR"]) == run
        assert Path(env["GPUSWARM_TASK_WORKSPACE"]) == run / "tasks" / f"t{i}"
        assert env["GPUSWARM_ATTEMPT"] == "1"
        assert env["GPUSWARM_GPU_IDS"] == cvd
        assert env["GPUSWARM_SLOT"] == cvd  # one slot per GPU: slot n owns GPU n
        assert env["GPUSWARM_SIMULATED"] == "1"
        assert info["argv"][0] == str(run / "tasks" / f"t{i}" / "env.json")  # {workspace}
        seen[f"t{i}"] = info
    infos = list(seen.values())
    for a_id, a in seen.items():
        for b_id, b in seen.items():
            if a_id < b_id and overlaps(a, b):
                gpu_a, gpu_b = a["env"]["CUDA_VISIBLE_DEVICES"], b["env"]["CUDA_VISIBLE_DEVICES"]
                assert gpu_a != gpu_b, f"{a_id} and {b_id} ran at the same time on GPU {gpu_a}"
    assert max_concurrency(infos) >= 2, "4 slots, 8 one-second tasks: some must overlap"
    assert len({i["env"]["CUDA_VISIBLE_DEVICES"] for i in infos}) >= 2
    started = [e for e in events(run) if e["ev"] == "started"]
    assert len(started) == 8
    assert all(e["gpus"] == [int(e["slot"].rsplit("-gpu", 1)[1])] for e in started)


def test_gpus_per_task_two_gives_pairs(tmp_path: Path) -> None:
    probe = write_probe(tmp_path)
    cfg = write_yaml(
        tmp_path / "pairs.yaml",
        {
            "gpus_per_task": 2,
            "tasks": [
                {
                    "matrix": {"i": [0, 1, 2, 3]},
                    "name": "p{i}",
                    "command": [PY, str(probe), "{workspace}/env.json", "0.8"],
                }
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:4", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    infos = [task_json(run, f"p{i}") for i in range(4)]
    cvds = {i["env"]["CUDA_VISIBLE_DEVICES"] for i in infos}
    assert cvds == {"0,1", "2,3"}
    for info in infos:
        env = info["env"]
        assert env["GPUSWARM_GPU_IDS"] == env["CUDA_VISIBLE_DEVICES"]
        assert env["GPUSWARM_HOST_GPU_ID"] == env["CUDA_VISIBLE_DEVICES"][0]
    for a in infos:
        for b in infos:
            if a is not b and overlaps(a, b):
                assert a["env"]["CUDA_VISIBLE_DEVICES"] != b["env"]["CUDA_VISIBLE_DEVICES"]
    assert json.loads((run / "run.json").read_text())["slot_count"] == 2


def test_tasks_per_gpu_two_gives_two_slots_per_gpu(tmp_path: Path) -> None:
    probe = write_probe(tmp_path)
    cfg = write_yaml(
        tmp_path / "share.yaml",
        {
            "tasks_per_gpu": 2,
            "tasks": [
                {
                    "matrix": {"i": [0, 1, 2, 3]},
                    "name": "s{i}",
                    "command": [PY, str(probe), "{workspace}/env.json", "1.5"],
                }
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:2", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    infos = [task_json(run, f"s{i}") for i in range(4)]
    slots = {int(i["env"]["GPUSWARM_SLOT"]) for i in infos}
    assert slots == {0, 1, 2, 3}, "four slots, four long tasks: each slot takes one"
    for info in infos:
        slot = int(info["env"]["GPUSWARM_SLOT"])
        assert info["env"]["CUDA_VISIBLE_DEVICES"] == str(slot % 2)
    per_gpu: dict[str, list[dict[str, Any]]] = {}
    for info in infos:
        per_gpu.setdefault(info["env"]["CUDA_VISIBLE_DEVICES"], []).append(info)
    assert sorted(per_gpu) == ["0", "1"]
    assert all(len(v) == 2 for v in per_gpu.values())
    labels = {e["slot"] for e in events(run) if e["ev"] == "started"}
    h = host_slug()  # slot ids name host + GPU; .1 = the second slot on a GPU
    assert labels == {f"{h}-gpu0", f"{h}-gpu1", f"{h}-gpu0.1", f"{h}-gpu1.1"}
    assert json.loads((run / "run.json").read_text())["slot_count"] == 4


def test_isolated_home_with_private_provisioned_credential(tmp_path: Path) -> None:
    probe = write_probe(tmp_path)
    secret_file = tmp_path / "host_auth.json"
    secret_file.write_text('{"token": "host-credential-42"}\n')
    cfg = write_yaml(
        tmp_path / "home.yaml",
        {
            "home": {
                "isolate": True,
                "provision": [{"src": str(secret_file), "dest": ".codex/auth.json"}],
            },
            "tasks": [
                {
                    "matrix": {"i": [0, 1]},
                    "name": "h{i}",
                    "command": [PY, str(probe), "{workspace}/env.json", "0.5"],
                }
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:2", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    homes = set()
    for i in range(2):
        info = task_json(run, f"h{i}")
        env = info["env"]
        home = Path(env["HOME"])
        assert home.is_relative_to(run), f"HOME {home} is not under the run dir {run}"
        assert home != Path.home()
        assert info["home_mode"] == 0o700, oct(info["home_mode"])
        for var in (
            "XDG_CACHE_HOME",
            "TORCH_EXTENSIONS_DIR",
            "TRITON_CACHE_DIR",
            "MIOPEN_USER_DB_PATH",
            "MPLCONFIGDIR",
            "CUDA_CACHE_PATH",
            "TMPDIR",
            "CODEX_HOME",
        ):
            assert Path(env[var]).is_relative_to(home), f"{var}={env[var]} not inside {home}"
        assert info["auth_mode"] == 0o600, oct(info["auth_mode"])
        assert info["auth_text"] == secret_file.read_text()
        homes.add(env["HOME"])
    # the two tasks overlapped on two slots: each slot has its own HOME
    assert len(homes) == 2
    # the host file is untouched
    assert stat.S_IMODE(secret_file.stat().st_mode) != 0o600


# == 2. Completion files ===========================================================================
def _write_result(text: str) -> list[str]:
    code = (
        "import os, pathlib, sys\n"
        "p = pathlib.Path(os.environ['GPUSWARM_TASK_WORKSPACE'], 'task_result.yaml')\n"
        "p.write_text(sys.argv[1])\n"
    )
    return [PY, "-c", code, text]


def test_completion_files_decide_done(tmp_path: Path) -> None:
    cfg = write_yaml(
        tmp_path / "kern.yaml",
        {
            "name": "kern",
            "defaults": {"done_when": "task_result.yaml"},
            "tasks": [
                {
                    "name": "good",
                    "command": _write_result(
                        "pass_correctness: true\nspeedup: 1.5\ndetails:\n  compiled: yes\n"
                    ),
                },
                {
                    "name": "incorrect",
                    "command": _write_result("pass_correctness: false\nspeedup: 0.7\n"),
                },
                {"name": "nofile", "command": [PY, "-c", "print('forgot the file')"]},
                {"name": "garbage", "command": _write_result("a: [unclosed\n  b: {\n")},
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:2", cfg, cwd=tmp_path)
    assert proc.returncode == 1, show(proc)
    run = only_run(tmp_path / "runs")
    rows = results(run)
    assert rows["good"]["state"] == "done"
    assert rows["good"]["result.pass_correctness"] == "true"
    assert rows["good"]["result.speedup"] == "1.5"
    assert rows["good"]["result.details.compiled"] == "true"  # YAML 'yes' is a boolean
    assert rows["incorrect"]["state"] == "done", "a task-level failure in the file is still done"
    assert rows["incorrect"]["result.pass_correctness"] == "false"
    assert rows["nofile"]["state"] == "failed"
    assert "task_result.yaml" in rows["nofile"]["reason"]
    assert rows["garbage"]["state"] == "failed"
    assert "task_result.yaml" in rows["garbage"]["reason"]
    assert "parse" in rows["garbage"]["reason"]
    s = summary(run)
    assert s["counts"] == {"pending": 0, "running": 0, "done": 2, "failed": 2}
    assert s["complete"] is False
    rate = s["fields"]["result.pass_correctness"]
    assert rate["true"] == 1
    assert rate["of_done"] == 2
    assert rate["of_total"] == 4
    assert rate["rate_done"] == pytest.approx(0.5)
    assert rate["rate_total"] == pytest.approx(0.25)
    assert s["fields"]["result.speedup"]["mean"] == pytest.approx(1.1)
    failed = {f["task"]: f["reason"] for f in s["failures"]}
    assert set(failed) == {"nofile", "garbage"}
    assert "task_result.yaml" in failed["nofile"]
    assert (run / ".parallel" / "done").is_dir()
    assert len(list((run / ".parallel" / "done").iterdir())) == 2
    assert len(list((run / ".parallel" / "failed").iterdir())) == 2


# == 3. Metrics ====================================================================================
def test_metrics_from_logs_including_carriage_return_progress(tmp_path: Path) -> None:
    progress = (
        "import sys\n"
        "sys.stdout.write('epoch 1/3 loss=3.0\\rval_bpb: 1.5\\repoch 2/3 loss=2.0\\r')\n"
        "sys.stdout.write('val_bpb: 0.975\\rloss=1.25 done\\n')\n"
        "print('bye')\n"
    )
    cfg = write_yaml(
        tmp_path / "m.yaml",
        {
            "defaults": {
                "metrics": {"val_bpb": r"^val_bpb:\s*([0-9.]+)", "loss": r"loss=([0-9.]+)"}
            },
            "tasks": [
                {"name": "plain", "command": [PY, "-c", "print('val_bpb: 1.234\\nloss=4')"]},
                {"name": "progress", "command": [PY, "-c", progress]},
                {"name": "none", "command": [PY, "-c", "print('no metric here')"]},
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:2", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    rows = results(run)
    assert rows["plain"]["val_bpb"] == "1.234"
    assert rows["plain"]["loss"] == "4"
    assert rows["progress"]["val_bpb"] == "0.975", "the last \\r-separated state wins"
    assert rows["progress"]["loss"] == "1.25"
    assert rows["none"]["val_bpb"] == ""
    stats = summary(run)["fields"]["val_bpb"]
    assert stats["n"] == 2
    assert stats["min"] == pytest.approx(0.975)


# == 4. Config features ============================================================================
def test_explicit_argv_shell_env_and_placeholders(tmp_path: Path) -> None:
    argv_code = "import json, os, sys; print('ARGV=' + json.dumps(sys.argv[1:]))"
    env_code = (
        "import json, os; "
        "print('ENV=' + json.dumps({k: os.environ.get(k) for k in ('A', 'B', 'C', 'D')}))"
    )
    cfg = write_yaml(
        tmp_path / "feat.yaml",
        {
            "defaults": {"env": {"A": "from-defaults", "B": "from-defaults", "D": 7}},
            "tasks": [
                {"name": "noshell", "command": "echo a > made_by_noshell", "shell": False},
                {"name": "withshell", "command": "echo a > made_by_shell", "shell": True},
                {
                    "name": "argv",
                    "command": [PY, "-c", argv_code, "two words", "{gpu}", "{attempt}", "$HOME"],
                },
                {
                    "name": "envtask",
                    "command": [PY, "-c", env_code],
                    "env": {"B": "from-task", "C": "{workspace}/c-{gpu}"},
                },
                {
                    "name": "retry",
                    "shell": True,
                    "max_attempts": 2,
                    "command": "echo {attempt} > {workspace}/attempt-{attempt}.txt; "
                    "test {attempt} -ge 2",
                },
                {"name": "cwd-ws", "cwd": "{workspace}", "command": "touch here.txt"},
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:1", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    rows = results(run)
    assert {r["state"] for r in rows.values()} == {"done"}

    # shell: false: a string command is split, not run by a shell: '>' is an argument to echo
    assert not (tmp_path / "made_by_noshell").exists()
    assert "a > made_by_noshell" in (run / "tasks/noshell/attempt-1/output.log").read_text()
    # shell: true runs /bin/sh -c in the config's folder
    assert (tmp_path / "made_by_shell").read_text().strip() == "a"

    log = (run / "tasks/argv/attempt-1/output.log").read_text()
    argv = json.loads(log.split("ARGV=", 1)[1].splitlines()[0])
    assert argv == ["two words", "0", "1", "$HOME"]

    log = (run / "tasks/envtask/attempt-1/output.log").read_text()
    env = json.loads(log.split("ENV=", 1)[1].splitlines()[0])
    assert env == {
        "A": "from-defaults",
        "B": "from-task",
        "C": f"{run}/tasks/envtask/c-0",
        "D": "7",
    }

    assert rows["retry"]["attempts"] == "2"
    assert (run / "tasks/retry/attempt-1.txt").read_text().strip() == "1"
    assert (run / "tasks/retry/attempt-2.txt").read_text().strip() == "2"
    assert (run / "tasks/retry/attempt-1/output.log").exists()
    assert (run / "tasks/retry/attempt-2/output.log").exists()
    assert (run / "tasks/cwd-ws/here.txt").exists()


def test_glob_and_matrix_tasks(tmp_path: Path) -> None:
    for sub in ("a", "b"):
        folder = tmp_path / "tasks" / "x" / sub
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(f"kernel: {sub}\n")
    (tmp_path / "tasks" / "x" / "not-a-task").mkdir()  # no config.yaml: not matched
    dump = "import os, sys; open(sys.argv[1], 'w').write('\\n'.join(sys.argv[2:]))"
    cfg = write_yaml(
        tmp_path / "g.yaml",
        {
            "tasks_root": "tasks/x",  # ids and task_rel relative to it (default: the config's)
            "tasks": [
                {
                    "glob": "tasks/x/*/config.yaml",
                    "command": [
                        PY,
                        "-c",
                        dump,
                        "{workspace}/seen.txt",
                        "{task_dir}",
                        "{task_file}",
                        "{task_rel}",
                    ],
                },
                {
                    "matrix": {"lr": [0.1, 0.01], "seed": [1, 2]},
                    "name": "lr{lr}-s{seed}",
                    "command": [PY, "-c", dump, "{workspace}/seen.txt", "{lr}", "{seed}"],
                },
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:2", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    rows = results(run)
    assert set(rows) == {"a", "b", "lr0.1-s1", "lr0.1-s2", "lr0.01-s1", "lr0.01-s2"}
    for sub in ("a", "b"):
        seen = (run / "tasks" / sub / "seen.txt").read_text().splitlines()
        task_dir = tmp_path / "tasks" / "x" / sub
        assert seen == [str(task_dir), str(task_dir / "config.yaml"), sub]
    for lr in ("0.1", "0.01"):
        for seed in ("1", "2"):
            seen = (run / "tasks" / f"lr{lr}-s{seed}" / "seen.txt").read_text().splitlines()
            assert seen == [lr, seed]


def test_priority_decides_order_on_one_slot(tmp_path: Path) -> None:
    cfg = write_yaml(
        tmp_path / "prio.yaml",
        {
            "tasks": [
                {"name": "low-first-in-file", "command": "true"},
                {"name": "mid", "command": "true", "priority": 5},
                {"name": "low-second-in-file", "command": "true"},
                {"name": "urgent", "command": "true", "priority": 100},
                {"name": "negative", "command": "true", "priority": -3},
            ],
            "gpus": "sim:1",  # the config's GPUs, used when --gpus is not given
        },
    )
    proc = gs("run", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "runs")
    order = [e["task"] for e in events(run) if e["ev"] == "started"]
    assert order == ["urgent", "mid", "low-first-in-file", "low-second-in-file", "negative"]
    assert {e["slot"] for e in events(run) if e["ev"] == "started"} == {f"{host_slug()}-gpu0"}


# == 5. Bad input ==================================================================================
BAD_CONFIGS = {
    "malformed": ("tasks: [\n  {command: echo\n", [r"malformed\.yaml:\d+", "YAML"]),
    "unknown-key": (
        "name: x\nbogus_key: 1\ntasks:\n  - command: echo hi\n",
        [r"unknown-key\.yaml:2\b", "bogus_key"],
    ),
    "wrong-type": (
        'name: x\ntasks:\n  - command: echo hi\n    max_attempts: "3"\n',
        [r"wrong-type\.yaml:4\b", "max_attempts"],
    ),
    "empty-tasks": ("name: x\ntasks: []\n", [r"empty-tasks\.yaml:2\b", "tasks"]),
    "glob-nothing": (
        "name: x\ntasks:\n  - glob: nowhere/*/config.yaml\n    command: echo {task_dir}\n",
        [r"glob-nothing\.yaml:3\b", "glob", "nowhere"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_exits_2_and_writes_nothing(tmp_path: Path, case: str) -> None:
    text, patterns = BAD_CONFIGS[case]
    (tmp_path / f"{case}.yaml").write_text(text)
    before = snapshot(tmp_path)
    proc = gs("run", "--gpus", "sim:2", f"{case}.yaml", cwd=tmp_path)
    assert proc.returncode == 2, show(proc)
    for pattern in patterns:
        assert re.search(pattern, proc.stderr), f"{pattern!r} not in message\n{show(proc)}"
    assert "Traceback" not in proc.stderr
    assert snapshot(tmp_path) == before, "bad input must not create anything"


BAD_COMMAND_LISTS = {
    "gpus-duplicate": (["--gpus", "0,0"], "echo hi\n", ["0,0"]),
    "gpus-sim-zero": (["--gpus", "sim:0"], "echo hi\n", ["sim:0"]),
    "unterminated-quote": (
        ["--gpus", "sim:1"],
        "echo fine\necho 'never closed\n",
        [r"cmds\.txt:2\b", "quot"],
    ),
    "placeholder-unknown": (["--gpus", "sim:1"], "echo {nope}\n", [r"cmds\.txt:1\b", "nope"]),
    "empty-list": (["--gpus", "sim:1"], "# only a comment\n\n", [r"cmds\.txt", "no commands"]),
    "bad-timeout": (["--gpus", "sim:1", "--timeout", "soon"], "echo hi\n", ["--timeout"]),
    "zero-attempts": (["--gpus", "sim:1", "--max-attempts", "0"], "echo hi\n", ["--max-attempts"]),
    "bad-name": (["--gpus", "sim:1", "--name", "../up"], "echo hi\n", [r"\.\./up"]),
}


@pytest.mark.parametrize("case", sorted(BAD_COMMAND_LISTS))
def test_bad_command_list_input_exits_2_and_writes_nothing(tmp_path: Path, case: str) -> None:
    flags, text, patterns = BAD_COMMAND_LISTS[case]
    (tmp_path / "cmds.txt").write_text(text)
    before = snapshot(tmp_path)
    proc = gs("run", *flags, "--workspace", "ws", "cmds.txt", cwd=tmp_path)
    assert proc.returncode == 2, show(proc)
    for pattern in patterns:
        assert re.search(pattern, proc.stderr), f"{pattern!r} not in message\n{show(proc)}"
    assert "Traceback" not in proc.stderr
    assert snapshot(tmp_path) == before, "bad input must not create anything"


def test_bad_name_with_command_list_blames_the_flag(tmp_path: Path) -> None:
    (tmp_path / "cmds.txt").write_text("echo hi\n")
    proc = gs("run", "--gpus", "sim:1", "--name", "../up", "cmds.txt", cwd=tmp_path)
    assert proc.returncode == 2, show(proc)
    assert "--name" in proc.stderr, show(proc)


def test_missing_command_list_exits_2(tmp_path: Path) -> None:
    proc = gs("run", "--gpus", "sim:1", "no-such-list.txt", cwd=tmp_path)
    assert proc.returncode == 2, show(proc)
    assert "no-such-list.txt" in proc.stderr
    assert snapshot(tmp_path) == set()


@pytest.mark.skipif(gpu_tools_present(), reason="this machine may have GPUs")
def test_explicit_gpu_ids_without_gpus_suggests_sim(tmp_path: Path) -> None:
    (tmp_path / "cmds.txt").write_text("echo hi\n")
    proc = gs("run", "--gpus", "0,99", "cmds.txt", cwd=tmp_path)
    assert proc.returncode == 2, show(proc)
    assert "sim:" in proc.stderr
    assert snapshot(tmp_path) == {"cmds.txt"}


@pytest.mark.skipif(gpu_tools_present(), reason="this machine may have GPUs")
def test_explicit_gpu_ids_without_gpus_names_the_value(tmp_path: Path) -> None:
    (tmp_path / "cmds.txt").write_text("echo hi\n")
    proc = gs("run", "--gpus", "0,99", "cmds.txt", cwd=tmp_path)
    assert proc.returncode == 2, show(proc)
    assert "0,99" in proc.stderr


def test_command_not_found_fails_only_that_task(tmp_path: Path) -> None:
    (tmp_path / "cmds.txt").write_text(
        "echo first\ngpuswarm-no-such-program-xyz --flag\necho third\n"
    )
    proc = gs("run", "--gpus", "sim:2", "--workspace", "ws", "cmds.txt", cwd=tmp_path)
    assert proc.returncode == 1, show(proc)
    run = only_run(tmp_path / "ws")
    rows = results(run)
    assert rows["cmd-00001"]["state"] == "done"
    assert rows["cmd-00003"]["state"] == "done"
    assert rows["cmd-00002"]["state"] == "failed"
    assert "command not found" in rows["cmd-00002"]["reason"]
    assert "gpuswarm-no-such-program-xyz" in rows["cmd-00002"]["reason"]
    assert "command not found" in proc.stderr


def test_command_not_found_under_shell(tmp_path: Path) -> None:
    (tmp_path / "cmds.txt").write_text("echo ok > ok.txt\ngpuswarm-no-such-program-xyz arg\n")
    proc = gs("run", "--gpus", "sim:1", "--shell", "--workspace", "ws", "cmds.txt", cwd=tmp_path)
    assert proc.returncode == 1, show(proc)
    rows = results(only_run(tmp_path / "ws"))
    assert rows["cmd-00001"]["state"] == "done"
    assert (tmp_path / "ok.txt").exists()
    assert rows["cmd-00002"]["state"] == "failed"
    assert "command not found" in rows["cmd-00002"]["reason"]
    assert "gpuswarm-no-such-program-xyz" in rows["cmd-00002"]["reason"]


# == 6. Secrets ====================================================================================
SECRETS = ("sk-verysecret123", "tok-abcdef-777", "hf_defaultsecret999")


def _no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"secret {secret!r} leaked into {where}"


def test_secrets_reach_tasks_but_no_record_or_output(tmp_path: Path) -> None:
    use = (
        "import hashlib, os, pathlib\n"
        "ws = pathlib.Path(os.environ['GPUSWARM_TASK_WORKSPACE'])\n"
        "for k in ('OPENAI_API_KEY', 'MY_TOKEN', 'HF_TOKEN'):\n"
        "    v = os.environ[k].encode()\n"
        "    (ws / (k + '.sha256')).write_text(hashlib.sha256(v).hexdigest())\n"
        "print('authenticated fine')\n"
    )
    cfg = write_yaml(
        tmp_path / "sec.yaml",
        {
            "defaults": {"env": {"HF_TOKEN": "hf_defaultsecret999"}},
            "tasks": [
                {
                    "name": "uses-key",
                    "command": [PY, "-c", use],
                    "env": {"OPENAI_API_KEY": "sk-verysecret123", "MY_TOKEN": "tok-abcdef-777"},
                },
                {
                    "name": "fails",
                    "command": [PY, "-c", "import sys; sys.exit(3)"],
                    "env": {"OPENAI_API_KEY": "sk-verysecret123"},
                },
            ],
        },
    )
    proc = gs("run", "--gpus", "sim:2", cfg, cwd=tmp_path)
    assert proc.returncode == 1, show(proc)
    _no_secret(proc.stdout + proc.stderr, "run output")
    proc_json = gs("run", "--gpus", "sim:2", "--json", "--suffix", "again", cfg, cwd=tmp_path)
    assert proc_json.returncode == 1, show(proc_json)
    _no_secret(proc_json.stdout + proc_json.stderr, "run --json output")

    for run in runs_under(tmp_path / "runs"):
        ws = run / "tasks" / "uses-key"
        for key, secret in (
            ("OPENAI_API_KEY", "sk-verysecret123"),
            ("MY_TOKEN", "tok-abcdef-777"),
            ("HF_TOKEN", "hf_defaultsecret999"),
        ):
            digest = hashlib.sha256(secret.encode()).hexdigest()
            assert (ws / f"{key}.sha256").read_text() == digest, f"{key} did not reach the task"
        for name in ("run.json", "events.jsonl", "summary.json", "results.tsv"):
            _no_secret((run / name).read_text(), f"{run.name}/{name}")
        info = json.loads((run / "run.json").read_text())
        task_env = info["config"]["tasks"][0]["env"]
        assert set(task_env) == {"OPENAI_API_KEY", "MY_TOKEN"}, "redacted, not dropped"
        assert info["config"]["defaults"]["env"]["HF_TOKEN"] != "hf_defaultsecret999"
        st = gs("status", run, cwd=tmp_path)
        st_json = gs("status", "--json", run, cwd=tmp_path)
        _no_secret(st.stdout + st.stderr + st_json.stdout + st_json.stderr, "status output")
    ls = gs("ls", "runs", cwd=tmp_path)
    _no_secret(ls.stdout + ls.stderr, "ls output")


def test_status_log_tail_does_not_leak_secrets(tmp_path: Path) -> None:
    cfg = write_yaml(
        tmp_path / "leak.yaml",
        {
            "tasks": [
                {
                    "name": "bad-key",
                    "command": 'echo "Incorrect API key provided: $OPENAI_API_KEY"; exit 1',
                    "shell": True,
                    "env": {"OPENAI_API_KEY": "sk-verysecret123"},
                }
            ]
        },
    )
    proc = gs("run", "--gpus", "sim:1", cfg, cwd=tmp_path)
    assert proc.returncode == 1, show(proc)
    run = only_run(tmp_path / "runs")
    assert "sk-verysecret123" in (run / "tasks/bad-key/attempt-1/output.log").read_text()
    st = gs("status", run, cwd=tmp_path)
    st_json = gs("status", "--json", run, cwd=tmp_path)
    assert "Incorrect API key provided" in st_json.stdout  # the tail is shown ...
    _no_secret(st.stdout + st_json.stdout, "status log tail")  # ... without the key


# == 7. Task ids cannot escape =====================================================================
def test_hostile_task_names_stay_inside_tasks_folder(tmp_path: Path) -> None:
    names = [
        "../../etc/evil",
        "a/b/c",
        "line1\nline2",
        "/abs/path",
        "..",
        ".hidden",
        "spaces and\ttabs",
        "x" * 300,
    ]
    write = (
        "import os, pathlib; pathlib.Path(os.environ['GPUSWARM_TASK_WORKSPACE'], 'w.txt')"
        ".write_text(os.environ['GPUSWARM_TASK_ID'])"
    )
    cfg = write_yaml(
        tmp_path / "cfg" / "evil.yaml",
        {
            "tasks": [
                *({"name": n, "command": [PY, "-c", write]} for n in names),
                {
                    "matrix": {"v": ["../../../up", "ok"]},
                    "name": "m{v}",
                    "command": [PY, "-c", write],
                },
            ]
        },
    )
    proc = gs("run", "--gpus", "sim:2", cfg, cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "cfg" / "runs")
    rows = results(run)
    assert len(rows) == len(names) + 2
    task_root = run / "tasks"
    children = sorted(p.name for p in task_root.iterdir())
    assert sorted(rows) == children
    for task_id in rows:
        assert _SAFE_ID.match(task_id), repr(task_id)
        folder = task_root / task_id
        assert folder.is_dir() and not folder.is_symlink()
        assert folder.resolve().parent == task_root.resolve()
        assert (folder / "w.txt").read_text() == task_id
    assert "etc-evil" in rows
    # nothing was written outside the run folder
    assert not (tmp_path / "etc").exists()
    assert not (tmp_path / "up").exists()
    assert not (tmp_path / "cfg" / "etc").exists()
    assert not (run.parent / "etc").exists()
    assert not Path("/abs/path").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg"]
    # every descriptor name is a plain file name in its state folder
    for desc in (run / ".parallel" / "done").iterdir():
        assert "/" not in desc.name and "\n" not in desc.name


def test_task_name_with_nul_byte_runs(tmp_path: Path) -> None:
    cfg = tmp_path / "nul.yaml"
    cfg.write_text('tasks:\n  - name: "nul\\0byte"\n    command: "true"\n')
    proc = gs("run", "--gpus", "sim:1", cfg, cwd=tmp_path)
    # either refused up front as bad input, or run under a safe id
    assert proc.returncode in (0, 2), show(proc)
    if proc.returncode == 2:
        assert "nul.yaml:2" in proc.stderr
        assert snapshot(tmp_path) == {"nul.yaml"}
    else:
        assert results(only_run(tmp_path / "runs"))["nul-byte"]["state"] == "done"


# == 8. status, ls, --json =========================================================================
def test_status_of_finished_run_and_ls(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("echo one\necho two\n")
    (tmp_path / "mixed.txt").write_text("echo fine\nsh -c 'echo boom-line-xyz; exit 3'\n")
    good = gs("run", "--gpus", "sim:2", "--workspace", "ws", "--json", "good.txt", cwd=tmp_path)
    assert good.returncode == 0, show(good)
    payload = json.loads(good.stdout)
    assert payload["exit_code"] == 0
    assert payload["complete"] is True
    assert payload["counts"]["done"] == 2
    mixed = gs("run", "--gpus", "sim:2", "--workspace", "ws", "--json", "mixed.txt", cwd=tmp_path)
    assert mixed.returncode == 1, show(mixed)
    payload = json.loads(mixed.stdout)
    assert payload["exit_code"] == 1
    assert payload["complete"] is False
    assert payload["failures"] == [{"task": "cmd-00002", "state": "failed", "reason": "exit 3"}]

    by_name = {r.parent.name: r for r in runs_under(tmp_path / "ws")}
    assert set(by_name) == {"good", "mixed"}

    st = gs("status", "--json", by_name["mixed"], cwd=tmp_path)
    assert st.returncode == 0, show(st)
    data = json.loads(st.stdout)
    assert data["live"] is False
    assert data["name"] == "mixed"
    assert data["counts"] == {"pending": 0, "running": 0, "done": 1, "failed": 1}
    assert data["total"] == 2
    assert data["running"] == []
    [failure] = data["failures"]
    assert failure["task"] == "cmd-00002"
    assert failure["reason"] == "exit 3"
    assert "boom-line-xyz" in failure["log_tail"]
    assert Path(failure["log"]).exists()

    human = gs("status", by_name["mixed"], cwd=tmp_path)
    assert human.returncode == 0, show(human)
    assert "mixed" in human.stdout
    assert "done 1" in human.stdout and "failed 1" in human.stdout
    assert "cmd-00002" in human.stdout and "exit 3" in human.stdout
    assert "boom-line-xyz" in human.stdout

    ls = gs("ls", "ws", "--json", cwd=tmp_path)
    assert ls.returncode == 0, show(ls)
    rows = {Path(r["run"]).parent.name: r for r in json.loads(ls.stdout)}
    assert set(rows) == {"good", "mixed"}
    assert rows["good"]["counts"]["done"] == 2 and rows["good"]["total"] == 2
    assert rows["mixed"]["counts"]["failed"] == 1
    assert not rows["good"]["live"] and not rows["mixed"]["live"]
    human_ls = gs("ls", "ws", cwd=tmp_path)
    assert human_ls.returncode == 0, show(human_ls)
    assert "complete" in human_ls.stdout and "finished with failures" in human_ls.stdout

    empty = gs("ls", "nothing-here", cwd=tmp_path)
    assert empty.returncode == 0 and "no runs" in empty.stdout
    assert json.loads(gs("ls", "nothing-here", "--json", cwd=tmp_path).stdout) == []
    bad = gs("status", "not-a-run", cwd=tmp_path)
    assert bad.returncode == 2 and "not-a-run" in bad.stderr


def test_human_ls_shows_run_folder_names(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("echo one\n")
    proc = gs("run", "--gpus", "sim:1", "--workspace", "ws", "a.txt", cwd=tmp_path)
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "ws")
    human_ls = gs("ls", tmp_path / "ws", cwd=tmp_path)  # an absolute workspace, as usual
    assert run.name in human_ls.stdout, human_ls.stdout


def test_status_of_live_run(tmp_path: Path) -> None:
    release = tmp_path / "release"
    wait = f"i=0; while [ ! -e {release} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
    (tmp_path / "live.txt").write_text(f"{wait}\n{wait}\n{wait}\n")
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "gpuswarm",
            "run",
            "--gpus",
            "sim:2",
            "--shell",
            "--workspace",
            "ws",
            "live.txt",
        ],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        deadline = time.monotonic() + 45
        data: dict[str, Any] = {}
        while time.monotonic() < deadline:
            runs = runs_under(tmp_path / "ws")
            if runs:
                st = gs("status", "--json", runs[0], cwd=tmp_path)
                if st.returncode == 0:
                    data = json.loads(st.stdout)
                    if len(data["running"]) == 2:
                        break
            time.sleep(0.2)
        assert len(data.get("running", [])) == 2, data
        run = runs_under(tmp_path / "ws")[0]
        assert data["live"] is True
        assert data["counts"] == {"pending": 1, "running": 2, "done": 0, "failed": 0}
        ids = [f"{host_slug()}-gpu{i}" for i in (0, 1)]
        assert sorted(r["slot"] for r in data["running"]) == ids
        for r in data["running"]:
            assert isinstance(r["elapsed"], (int, float)) and r["elapsed"] >= 0
            assert r["attempt"] == 1
            assert r["task"].startswith("cmd-")
        human = gs("status", run, cwd=tmp_path)
        assert "live" in human.stdout and "running 2" in human.stdout, show(human)
        ls = json.loads(gs("ls", "ws", "--json", cwd=tmp_path).stdout)
        assert ls[0]["live"] is True
        release.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            release.touch()
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, f"{out}\n{err}"
    final = json.loads(gs("status", "--json", run, cwd=tmp_path).stdout)
    assert final["live"] is False
    assert final["counts"]["done"] == 3
    assert final["running"] == []


# == 9. Command-list flags =========================================================================
def test_command_list_from_stdin_with_shell(tmp_path: Path) -> None:
    proc = gs(
        "run",
        "--gpus",
        "sim:2",
        "--shell",
        "--workspace",
        "ws",
        "-",
        cwd=tmp_path,
        stdin="echo one > out1.txt\n\n# a comment\necho two | tr a-z A-Z > out2.txt\n",
    )
    assert proc.returncode == 0, show(proc)
    assert (tmp_path / "out1.txt").read_text().strip() == "one"
    assert (tmp_path / "out2.txt").read_text().strip() == "TWO"
    run = only_run(tmp_path / "ws")
    assert run.parent.name == "stdin"
    rows = results(run)
    assert set(rows) == {"cmd-00001", "cmd-00004"}  # ids follow line numbers
    assert json.loads((run / "run.json").read_text())["source"] == "<stdin>"


def test_empty_stdin_is_bad_input(tmp_path: Path) -> None:
    proc = gs("run", "--gpus", "sim:1", "-", cwd=tmp_path, stdin="\n# nothing\n")
    assert proc.returncode == 2, show(proc)
    assert "<stdin>" in proc.stderr and "no commands" in proc.stderr
    assert snapshot(tmp_path) == set()


def test_hostile_suffix_stays_one_folder(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("echo hi\n")
    proc = gs(
        "run",
        "--gpus",
        "sim:1",
        "--workspace",
        "ws",
        "--suffix",
        "../../evil x",
        "c.txt",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, show(proc)
    run = only_run(tmp_path / "ws")
    assert run.parent == tmp_path / "ws" / "c"
    assert run.name.startswith("run_") and run.name.endswith("evil-x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "ws"]


def test_command_list_from_stdin_without_shell_splits(tmp_path: Path) -> None:
    proc = gs(
        "run",
        "--gpus",
        "sim:1",
        "--workspace",
        "ws",
        "--no-shell",
        "-",
        cwd=tmp_path,
        stdin="echo 'quoted arg' > not-created.txt\n",
    )
    assert proc.returncode == 0, show(proc)
    assert not (tmp_path / "not-created.txt").exists()
    log = (only_run(tmp_path / "ws") / "tasks/cmd-00001/attempt-1/output.log").read_text()
    assert "quoted arg > not-created.txt" in log


def test_flags_timeout_retries_name_workspace_suffix_json(tmp_path: Path) -> None:
    (tmp_path / "jobs.txt").write_text("sleep 30\nsh -c 'test {attempt} -ge 2'\necho ok\n")
    t0 = time.monotonic()
    proc = gs(
        "run",
        "--gpus",
        "sim:3",
        "--timeout",
        "1s",
        "--max-attempts",
        "2",
        "--name",
        "myrun",
        "--workspace",
        "out/ws",
        "--suffix",
        "exp1",
        "--json",
        "jobs.txt",
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, show(proc)
    assert elapsed < 25, f"a 1s timeout took {elapsed:.1f}s"
    payload = json.loads(proc.stdout)
    assert payload["exit_code"] == 1
    assert payload["counts"] == {"pending": 0, "running": 0, "done": 2, "failed": 1}
    assert not (tmp_path / "runs").exists()
    run = only_run(tmp_path / "out" / "ws")
    assert run.parent.name == "myrun"
    assert run.name.startswith("run_") and run.name.endswith("_exp1")
    rows = results(run)
    assert rows["cmd-00001"]["state"] == "failed"
    assert "timeout" in rows["cmd-00001"]["reason"]
    assert rows["cmd-00001"]["attempts"] == "2"
    assert rows["cmd-00002"]["state"] == "done"
    assert rows["cmd-00002"]["attempts"] == "2"
    assert rows["cmd-00003"]["state"] == "done"
    assert rows["cmd-00003"]["attempts"] == "1"
    finished = [e for e in events(run) if e["ev"] == "finished" and e["task"] == "cmd-00001"]
    assert [e["retry"] for e in finished] == [True, False]
    info = json.loads((run / "run.json").read_text())
    assert info["name"] == "myrun"
    assert info["config"]["defaults"]["timeout"] == 1.0
    assert info["config"]["defaults"]["max_attempts"] == 2


def test_run_json_output_is_pure_json_and_human_output_readable(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("echo hello\nfalse\n")
    proc = gs("run", "--gpus", "sim:2", "--workspace", "ws", "--json", "c.txt", cwd=tmp_path)
    assert proc.returncode == 1, show(proc)
    payload = json.loads(proc.stdout)  # nothing else on stdout
    assert payload["total"] == 2
    human = gs("run", "--gpus", "sim:2", "--workspace", "ws", "c.txt", cwd=tmp_path)
    assert human.returncode == 1, show(human)
    text = human.stdout + human.stderr
    assert "cmd-00002" in text and "exit 1" in text
    assert "gpuswarm resume" in text
    quiet = gs("run", "--gpus", "sim:2", "--workspace", "ws", "-q", "c.txt", cwd=tmp_path)
    assert quiet.returncode == 1
    assert "start" not in quiet.stderr.split("\n")[0]
    assert len(runs_under(tmp_path / "ws")) == 3
