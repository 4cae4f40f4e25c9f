"""Issue 11 (semantics on real workloads): completion files, the breaker, finished work, preflight,
skipped tasks, after_all, one run per GPU, and what status / ls / watch / the summary say.

Every test drives the real CLI on simulated GPUs and judges by what is on disk and printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run
from integration_support import descriptor, task_states

from gpuswarm.store.leases import host_slug

pytestmark = pytest.mark.slow

PY = sys.executable
Gs = Callable[..., CliResult]
Popen = Callable[..., CliProcess]


def slot(gpu: int) -> str:
    """The label of this host's slot on ``gpu`` (slot ids name host + GPU)."""
    return f"{host_slug()}-gpu{gpu}"


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def summary_of(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return data


def only_run(workspace: Path) -> Path:
    runs = sorted(p for p in workspace.glob("*/run_*") if (p / "run.json").is_file())
    assert len(runs) == 1, runs
    return runs[0]


# -- item 1: a stale completion file never counts ------------------------------------------------
def test_a_completion_file_shipped_in_the_task_folder_is_not_done(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    for name in ("ships", "writes"):
        folder = tmp_path / "tasks" / name
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text("kind: test\n")
    old = tmp_path / "tasks" / "ships" / "report.yaml"
    old.write_text("passed: true\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    # AKA's flow: copy the task folder into the workspace (times kept), then run the agent,
    # which here writes the report only for 'writes'
    cmd = (
        "cp -a {task_dir}/. {workspace}/ && "
        "if [ {task_rel} = writes ]; then echo 'passed: true' > {workspace}/report.yaml; fi"
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "stale",
            "gpus": "sim:2",
            "tasks_root": "tasks",
            "defaults": {"done_when": "report.yaml"},
            "tasks": [{"glob": "tasks/*/config.yaml", "command": cmd, "shell": True}],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    assert task_states(run) == {"ships": "failed", "writes": "done"}
    assert "not written by this attempt" in summary_of(run)["failures"][0]["reason"]


def test_a_completion_file_left_by_an_earlier_attempt_is_moved_aside(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    # attempt 1 writes its report and then fails; attempt 2 exits 0 without writing one
    cmd = "if [ {attempt} = 1 ]; then echo 'passed: true' > {workspace}/r.yaml; exit 1; fi; exit 0"
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "stale2",
            "gpus": "sim:1",
            "reliability": {"retry_backoff": None},
            "tasks": [
                {
                    "name": "t",
                    "command": cmd,
                    "shell": True,
                    "done_when": "r.yaml",
                    "max_attempts": 2,
                }
            ],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    assert task_states(run) == {"t": "failed"}
    kept = run / "tasks" / "t" / "stale" / "attempt-2-r.yaml"
    assert kept.read_text() == "passed: true\n"  # kept, never deleted
    assert not (run / "tasks" / "t" / "r.yaml").exists()
    (ev,) = [e for e in read_events(run) if e["ev"] == "stale_result"]
    assert ev["task"] == "t" and ev["attempt"] == 2
    assert ev["moved_to"] == "tasks/t/stale/attempt-2-r.yaml"


# -- item 5: finished work is not re-run --------------------------------------------------------
@pytest.mark.parametrize("talk", [False, True], ids=["quiet", "printing"])
def test_tasks_that_finish_after_a_sigkill_of_the_supervisor_are_done_on_resume(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen, talk: bool
) -> None:
    # 'a' and 'b' write their result after the supervisor is gone; 'c' exits 0 without one on
    # its first attempt (so it must run again), and writes one on the next. "printing": they
    # print after the supervisor died (no reader of their log pipe is left in it: EPIPE or
    # SIGPIPE would end them there, before their result)
    say = "for i in 1 2 3 4 5 6 7 8; do echo still working $i; done; " if talk else ""
    cmd = (
        "while [ ! -e {run_dir}/../../go ]; do sleep 0.05; done; "
        + say
        + "if [ {name} != c ] || [ {attempt} != 1 ]; then echo 'ok: true' > {workspace}/r.yaml; fi"
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "orphans",
            "gpus": "sim:3",
            "tasks": [
                {"name": n, "command": cmd, "shell": True, "done_when": "r.yaml"}
                for n in ("a", "b", "c")
            ],
        },
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: len([e for e in read_events(run) if e["ev"] == "started"]) == 3, 30)
    proc.send(signal.SIGKILL)
    proc.wait(30)
    (tmp_path / "runs" / "go").touch()  # the orphans finish now, their supervisor dead
    wait_for(lambda: all((run / "tasks" / n / "r.yaml").exists() for n in ("a", "b")), 30)
    time.sleep(0.5)  # let the orphans exit
    res = gpuswarm("resume", run, "--plain")
    assert res.returncode == 0, res
    assert task_states(run) == {"a": "done", "b": "done", "c": "done"}
    started = [e["task"] for e in read_events(run) if e["ev"] == "started"]
    assert sorted(started) == ["a", "b", "c", "c"]  # only c ran again
    for name in ("a", "b"):
        last = descriptor(run, name)["attempts"][-1]
        assert last["kind"] == "orphan", last
        assert last["reason"].startswith("finished after its supervisor died"), last
    assert descriptor(run, "c")["attempts"][0]["kind"] == "lost"
    assert gpuswarm("check", run).returncode == 0


def test_tasks_that_exit_0_in_the_grace_period_of_a_ctrl_c_are_done(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    # on SIGTERM 'fin' finishes its work (writes its result) and exits 0; 'quit' exits 0 without
    # a result: it is handed back, not failed and not done
    script = tmp_path / "task.sh"
    script.write_text(
        "#!/bin/sh\n"
        'trap \'[ "$1" = fin ] && echo "ok: true" > "$2/r.yaml"; exit 0\' TERM\n'
        'touch "$2/up"\n'
        "while true; do sleep 0.05; done\n"
    )
    script.chmod(0o755)
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "grace",
            "gpus": "sim:2",
            "grace": "20s",
            "tasks": [
                {"name": n, "command": [str(script), n, "{workspace}"], "done_when": "r.yaml"}
                for n in ("fin", "quit")
            ],
        },
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: all((run / "tasks" / n / "up").exists() for n in ("fin", "quit")), 30)
    proc.send(signal.SIGINT)
    res = proc.wait(60)
    assert res.returncode == 130, res
    assert task_states(run) == {"fin": "done", "quit": "pending"}
    fin = descriptor(run, "fin")["attempts"][-1]
    assert fin["reason"] == "exit 0 during the stop's grace period", fin
    quit_ = descriptor(run, "quit")["attempts"][-1]
    assert quit_["interrupted"] is True and "not done" in quit_["reason"], quit_


# -- item 8: preflight, and programs that cannot be found ----------------------------------------
def test_a_failing_preflight_stops_the_run_before_any_task(tmp_path: Path, gpuswarm: Gs) -> None:
    seen = tmp_path / "seen.txt"
    check = (
        f'echo "$GPUSWARM_HOST_GPU_ID $CUDA_VISIBLE_DEVICES $HOME" >> {seen}; '
        'if [ "$GPUSWARM_HOST_GPU_ID" = 1 ]; then echo "codex: not logged in"; exit 3; fi'
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "pre",
            "gpus": "sim:3",
            "home": {"isolate": True},
            "preflight": ["true", check],
            "tasks": [{"name": f"t{i}", "command": "true"} for i in range(4)],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 2, res
    assert f"preflight failed on {slot(1)}" in res.stderr and "exit 3" in res.stderr, res
    assert "codex: not logged in" in res.stderr, res
    run = only_run(tmp_path / "runs")
    assert set(task_states(run).values()) == {"pending"}  # nothing started, nothing failed
    assert not [e for e in read_events(run) if e["ev"] == "started"]
    lines = sorted(seen.read_text().split("\n")[:-1])
    assert [ln.split()[:2] for ln in lines] == [["0", "0"], ["1", "1"], ["2", "2"]]
    for ln in lines:  # each slot's own private HOME
        gpu, _, home = ln.split()
        assert home.endswith(f"homes/{slot(int(gpu))}"), ln


def test_a_passing_preflight_then_tasks_run(tmp_path: Path, gpuswarm: Gs) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "pre2",
            "gpus": "sim:2",
            "preflight": [f"touch {marks}/pre-$GPUSWARM_HOST_GPU_ID"],
            "tasks": [{"name": "t", "command": f"test -e {marks}/pre-0 -a -e {marks}/pre-1"}],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 0, res
    assert (only_run(tmp_path / "runs") / "preflight" / f"{slot(0)}.log").is_file()


def test_every_task_program_missing_is_one_clear_line_and_blames_no_gpu(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "nocodex",
            "gpus": "sim:8",
            "tasks": [
                {
                    "glob": "tasks/*/config.yaml",
                    "command": "codex-gs-missing exec --task {task_dir}",
                }
            ],
        },
    )
    for i in range(20):
        (tmp_path / "tasks" / f"k{i}").mkdir(parents=True)
        (tmp_path / "tasks" / f"k{i}" / "config.yaml").write_text("a: 1\n")
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 2, res
    errors = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "command not found: codex-gs-missing (20 tasks)" in errors[0], res
    assert "GPU" not in res.stderr and "quarantine" not in res.stderr
    assert not list((tmp_path / "runs").glob("*/run_*"))  # nothing was created


# -- item 2: the circuit breaker blames a GPU only when the GPU is the difference -----------------
def test_fast_task_failures_first_quarantine_no_gpu(tmp_path: Path, gpuswarm: Gs) -> None:
    tasks: list[dict[str, Any]] = [
        {"name": f"skip{i}", "command": "exit 3", "shell": True, "priority": 10} for i in range(10)
    ]
    tasks += [{"name": f"good{i}", "command": "true"} for i in range(100)]
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "fastfail",
            "gpus": "sim:2",
            "reliability": {"breaker": {"failures": 3, "window": "60s"}},
            "tasks": tasks,
        },
    )
    res = gpuswarm("run", config, "--plain", timeout=120)
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    s = summary_of(run)
    assert s["quarantined"] == [], s["quarantined"]
    assert s["counts"]["done"] == 100 and s["counts"]["failed"] == 10, s["counts"]
    assert not [e for e in read_events(run) if e["ev"] == "quarantined"]


def test_a_program_hidden_behind_shell_syntax_fails_as_not_found_not_as_a_gpu(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "hidden",
            "gpus": "sim:4",
            "reliability": {"breaker": {"failures": 2}},
            "tasks": [
                {"name": f"t{i}", "command": "cd . && codex-gs-missing exec", "shell": True}
                for i in range(30)
            ],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    run = only_run(tmp_path / "runs")
    s = summary_of(run)
    assert s["quarantined"] == [] and s["counts"]["failed"] == 30, s
    assert "30 failed: command not found: codex-gs-missing" in res.stderr, res
    assert "quarantine" not in res.stderr.lower()


BROKEN_GPU = (
    'if [ "$GPUSWARM_HOST_GPU_ID" = 2 ]; then echo "CUDA error: an illegal memory access"; '
    "exit 1; fi; sleep 0.1"
)


def test_only_the_broken_gpu_is_quarantined_and_its_tasks_finish_elsewhere(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "broken",
            "gpus": "sim:4",
            "reliability": {
                "retry_backoff": "0.2s",
                "breaker": {"failures": 3, "window": "60s", "cooldown": "1s"},
            },
            "defaults": {"max_attempts": 6},
            "tasks": [{"name": f"t{i}", "command": BROKEN_GPU, "shell": True} for i in range(60)],
        },
    )
    res = gpuswarm("run", config, "--plain", timeout=120)
    assert res.returncode == 0, res
    run = only_run(tmp_path / "runs")
    s = summary_of(run)
    assert s["counts"]["done"] == 60, s["counts"]
    assert {q["slot"] for q in s["quarantined"]} == {slot(2)}, s["quarantined"]
    events = read_events(run)
    assert {e["slot"] for e in events if e["ev"] == "quarantined"} == {slot(2)}
    # probed again after the 1 s cool-down: the probe fails, so it is quarantined again
    assert [e for e in events if e["ev"] == "unquarantined" and e.get("probe")], events
    assert "QUARANTINED" in res.stderr  # the plain live lines say so
    report = (run / "report.html").read_text()
    assert slot(2) in report and "quarantined" in report.lower()
    st = gpuswarm("status", run, "--json")
    assert [q["slot"] for q in json.loads(st.stdout)["quarantined"]] == [slot(2)], st
    assert f"QUARANTINED {slot(2)}" in gpuswarm("status", run).stdout


def test_a_quarantine_is_shown_by_status_and_lifted_by_hand(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    stay = tmp_path / "stay"
    stay.touch()
    cmd = (
        'if [ "$GPUSWARM_HOST_GPU_ID" = 1 ]; then exit 1; fi; '
        f"while [ -e {stay} ] && [ {{name}} = long ]; do sleep 0.05; done; sleep 0.05"
    )
    # gpu1 fails every attempt at once; gpu0 succeeds, then runs 'long' (last), which keeps
    # the run live until the test removes its file
    tasks = [{"name": "long", "command": cmd, "shell": True, "priority": -5}]
    tasks += [{"name": f"t{i}", "command": cmd, "shell": True} for i in range(8)]
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "byhand",
            "gpus": "sim:2",
            "reliability": {"retry_backoff": None, "breaker": {"failures": 2, "cooldown": "1h"}},
            "defaults": {"max_attempts": 9},
            "tasks": tasks,
        },
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: [e for e in read_events(run) if e["ev"] == "quarantined"], 30)
    st = json.loads(gpuswarm("status", run, "--json").stdout)
    assert [q["slot"] for q in st["quarantined"]] == [slot(1)], st
    text = gpuswarm("status", run).stdout
    assert f"QUARANTINED {slot(1)}" in text, text
    assert f"gpuswarm unquarantine {run} {slot(1)}" in text, text
    res = gpuswarm("unquarantine", run, "gpu1")
    assert res.returncode == 0 and "gpu1" in res.stdout, res
    wait_for(
        lambda: [
            e
            for e in read_events(run)
            if e["ev"] == "unquarantined" and e.get("reason") == "lifted by hand"
        ],
        30,
    )
    stay.unlink()
    assert proc.wait(60).returncode in (0, 1)
    assert gpuswarm("unquarantine", run, "gpu1").returncode == 1  # nothing left to lift


# -- item 9: skipped tasks ---------------------------------------------------------------------
def test_skipped_tasks_are_not_failures_and_stay_out_of_pass_rates(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    for name in ("cuda-only", "ok1", "ok2", "broken", "old1"):
        (tmp_path / "tasks" / name).mkdir(parents=True)
        (tmp_path / "tasks" / name / "config.yaml").write_text("a: 1\n")
    # the stand-in agent: a platform skip exits 3, 'broken' fails, the others pass
    cmd = (
        "case {task_rel} in cuda-only) exit 3;; broken) echo 'passed: false' > {workspace}/r.json;;"
        " *) echo '{{\"passed\": true}}' > {workspace}/r.json;; esac"
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "skips",
            "gpus": "sim:2",
            "tasks_root": "tasks",
            "defaults": {"skip_exit_code": 3, "done_when": "r.json"},
            "tasks": [
                {
                    "glob": "tasks/*/config.yaml",
                    "exclude": ["tasks/old*/config.yaml"],
                    "command": cmd,
                    "shell": True,
                }
            ],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res  # 'broken' wrote no valid JSON: failed
    run = only_run(tmp_path / "runs")
    s = summary_of(run)
    assert s["counts"]["skipped"] == 2 and s["counts"]["done"] == 2, s["counts"]
    assert s["counts"]["failed"] == 1, s["counts"]
    assert {f["task"] for f in s["failures"]} == {"broken"}
    skipped = {k["task"]: k["reason"] for k in s["skipped"]}
    assert skipped["cuda-only"] == "skipped (exit 3 = skip_exit_code)"
    assert skipped["old1"] == "excluded by tasks/old*/config.yaml"
    passed = s["fields"]["result.passed"]
    assert (passed["true"], passed["of_done"], passed["of_total"]) == (2, 2, 3), passed
    assert sorted(p.name.split("_", 1)[1] for p in (run / ".parallel/skipped").iterdir()) == [
        "cuda-only.json",
        "old1.json",
    ]
    assert not (run / "tasks" / "old1").exists()  # never ran
    report = (run / "report.html").read_text()
    assert "Skipped (2)" in report and "excluded by tasks/old*/config.yaml" in report
    assert gpuswarm("check", run).returncode == 0


# -- item 11: after_all ---------------------------------------------------------------------------
def test_after_all_runs_once_with_the_run_dir_and_its_failure_is_the_exit_code(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    def config(name: str, step: str) -> Path:
        return write_config(
            tmp_path / f"{name}.yaml",
            {
                "name": name,
                "gpus": "sim:3",
                "after_all": step,
                "tasks": [{"name": f"t{i}", "command": "true"} for i in range(5)],
            },
        )

    good = config("post", 'echo "post of $GPUSWARM_RUN_DIR"; wc -l < "$GPUSWARM_RESULTS"')
    res = gpuswarm("run", good, "--plain")
    assert res.returncode == 0, res
    run = only_run(tmp_path / "runs")  # one run so far
    log = (run / "after_all.log").read_text()
    assert f"post of {run}" in log and "6" in log, log  # results.tsv was there: header + 5
    s = summary_of(run)
    assert s["after_all"]["ok"] is True and s["after_all"]["exit"] == 0, s["after_all"]
    assert len([e for e in read_events(run) if e["ev"] == "after_all"]) == 1

    bad = config("postbad", "echo aggregation broke; exit 4")
    res = gpuswarm("run", bad, "--plain")
    assert res.returncode == 1, res
    assert "after_all FAILED (exit 4)" in res.stderr, res
    (run,) = (tmp_path / "runs" / "postbad").glob("run_*")
    assert summary_of(run)["after_all"]["exit"] == 4
    assert "aggregation broke" in (run / "after_all.log").read_text()


# -- item 12: one run per GPU at a time on a host --------------------------------------------------
def test_a_second_run_on_held_gpus_is_refused_naming_the_run(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    env = {"GPUSWARM_LOCK_DIR": str(tmp_path / "locks")}
    go = tmp_path / "go"
    first = write_config(
        tmp_path / "first.yaml",
        {
            "name": "first",
            "gpus": "sim:2",
            "tasks": [
                {
                    "name": "wait",
                    "command": f"while [ ! -e {go} ]; do sleep 0.05; done",
                    "shell": True,
                }
            ],
        },
    )
    second = write_config(
        tmp_path / "second.yaml",
        {"name": "second", "gpus": "sim:1", "tasks": [{"name": "t", "command": "true"}]},
    )
    proc = gpuswarm_popen("run", first, "--plain", env=env)
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: [e for e in read_events(run) if e["ev"] == "started"], 30)
    res = gpuswarm("run", second, "--plain", env=env)
    assert res.returncode == 2, res
    assert f"sim-0 by the live run {run}" in res.stderr and "--share-gpus" in res.stderr, res
    assert not (tmp_path / "runs" / "second").exists() or not list(
        (tmp_path / "runs" / "second").glob("run_*")
    )
    shared = gpuswarm("run", second, "--plain", "--share-gpus", env=env)
    assert shared.returncode == 0, shared
    go.touch()
    assert proc.wait(60).returncode == 0
    again = gpuswarm("run", second, "--plain", env=env)  # the first run's hold is gone
    assert again.returncode == 0, again


def test_simulated_gpus_are_not_locked_without_an_explicit_lock_dir(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    """Two demos or test suites on sim:N at once on one host never refuse each other (a sim
    GPU is no shared device): without $GPUSWARM_LOCK_DIR nothing is locked for them."""
    go = tmp_path / "go"
    wait = {"name": "wait", "command": f"while [ ! -e {go} ]; do sleep 0.05; done", "shell": True}
    first = write_config(
        tmp_path / "first.yaml", {"name": "first", "gpus": "sim:1", "tasks": [wait]}
    )
    second = write_config(
        tmp_path / "second.yaml",
        {"name": "second", "gpus": "sim:1", "tasks": [{"name": "t", "command": "true"}]},
    )
    proc = gpuswarm_popen("run", first, "--plain")  # cli_env drops any GPUSWARM_LOCK_DIR
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: [e for e in read_events(run) if e["ev"] == "started"], 30)
    res = gpuswarm("run", second, "--plain")
    assert res.returncode == 0, res
    go.touch()
    assert proc.wait(60).returncode == 0


# -- smaller things ------------------------------------------------------------------------
def test_true_counts_in_the_summary_and_status(tmp_path: Path, gpuswarm: Gs) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "many",
            "gpus": "sim:4",
            "tasks": [
                {"name": f"t{i:03d}", "command": f"exit {1 + i % 3}", "shell": True}
                for i in range(230)
            ],
        },
    )
    res = gpuswarm("run", config, "--plain", timeout=120)
    assert res.returncode == 1, res
    assert "... and 220 more (see results.tsv)" in res.stderr, res  # not "190": the capped list
    assert "77 failed: exit 1" in res.stderr, res
    run = only_run(tmp_path / "runs")
    assert summary_of(run)["not_done"] == 230
    st = gpuswarm("status", run)
    assert "latest 20 of 230 failures" in st.stdout, st
    assert "finished with failures" in st.stdout, st
    ls = gpuswarm("ls", tmp_path / "runs")
    assert "finished with failures" in ls.stdout, ls


def test_busy_seconds_count_every_attempt(tmp_path: Path, gpuswarm: Gs) -> None:
    cmd = "sleep 0.4; [ {attempt} -ge 3 ]"
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "busy",
            "gpus": "sim:1",
            "reliability": {"retry_backoff": None},
            "tasks": [{"name": "t", "command": cmd, "shell": True, "max_attempts": 3}],
        },
    )
    assert gpuswarm("run", config, "--plain").returncode == 0
    run = only_run(tmp_path / "runs")
    attempts = descriptor(run, "t")["attempts"]
    assert len(attempts) == 3
    total = sum(a["duration"] for a in attempts)
    assert summary_of(run)["busy_seconds"] == pytest.approx(total, abs=0.01)
    assert summary_of(run)["busy_seconds"] > 1.2  # three attempts of 0.4 s, not the last one
    assert "task time (all attempts)" in (run / "report.html").read_text()


def test_a_resume_with_a_fresh_budget_counts_attempts_from_1(tmp_path: Path, gpuswarm: Gs) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "budget",
            "gpus": "sim:1",
            "reliability": {"retry_backoff": None},
            "tasks": [{"name": "t", "command": "exit 1", "shell": True, "max_attempts": 2}],
        },
    )
    first = gpuswarm("run", config, "--plain")
    assert "(attempt 1, 1/2 of max_attempts used)" in first.stderr, first
    run = only_run(tmp_path / "runs")
    again = gpuswarm("resume", run, "--plain")
    assert again.returncode == 1, again
    # the attempt keeps its own number (attempt-3/); the fresh budget counts from 1 (issue 28)
    assert "(attempt 3, 1/2 of max_attempts used)" in again.stderr, again
    assert "3/2" not in again.stderr, again


def _wait_until_idle(pid: int, timeout: float = 30.0) -> None:
    """Until the process's CPU time stops growing (it sleeps in its loop, imports done)."""
    proc = psutil.Process(pid)
    deadline = time.monotonic() + timeout
    last = -1.0
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            used = sum(proc.cpu_times()[:2])
            if used - last < 0.02:
                return
            last = used
        time.sleep(0.3)


def test_watch_interrupted_says_it_stopped_watching(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    go = tmp_path / "go"
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "watched",
            "gpus": "sim:1",
            "tasks": [
                {
                    "name": "t",
                    "command": f"while [ ! -e {go} ]; do sleep 0.05; done",
                    "shell": True,
                }
            ],
        },
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    watcher = gpuswarm_popen("watch", run, "--plain")
    time.sleep(1.5)
    _wait_until_idle(watcher.pid)  # past its imports (a loaded machine: xdist workers)
    watcher.send(signal.SIGINT)
    res = watcher.wait(30)
    assert res.returncode == 130, res
    assert "stopped watching" in res.stderr and "before any task started" not in res.stderr
    assert proc.alive()  # the run goes on
    go.touch()
    assert proc.wait(60).returncode == 0


def test_status_of_a_crashed_run_says_its_owner_is_dead(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {"name": "crash", "gpus": "sim:1", "tasks": [{"name": "t", "command": "sleep 30"}]},
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: [e for e in read_events(run) if e["ev"] == "started"], 30)
    proc.send(signal.SIGKILL)
    proc.wait(30)
    st = gpuswarm("status", run)
    assert "crashed" in st.stdout and "supervisor is gone" in st.stdout, st
    assert f"gpuswarm resume {run}" in st.stdout, st
    assert json.loads(gpuswarm("status", run, "--json").stdout)["state"] == "crashed"
    assert "crashed" in gpuswarm("ls", tmp_path / "runs").stdout
    assert gpuswarm("report", run).returncode == 0
    assert 'b-no">crashed' in (run / "report.html").read_text()


def test_a_stopped_run_is_shown_as_stopped(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {"name": "stopme", "gpus": "sim:1", "tasks": [{"name": "t", "command": "sleep 30"}]},
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: [e for e in read_events(run) if e["ev"] == "started"], 30)
    proc.send(signal.SIGINT)
    assert proc.wait(60).returncode == 130
    assert summary_of(run)["state"] == "stopped"
    assert "stopped" in gpuswarm("ls", tmp_path / "runs").stdout
    assert "stopped" in (run / "report.html").read_text()


def test_work_reclaiming_a_dead_supervisors_finished_tasks_judges_them_done(
    tmp_path: Path, gpuswarm: Gs, gpuswarm_popen: Popen
) -> None:
    cmd = (
        "while [ ! -e {run_dir}/../../go ]; do sleep 0.05; done; "
        "echo 'ok: true' > {workspace}/r.yaml"
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "reclaimed",
            "gpus": "sim:2",
            "tasks": [
                {"name": n, "command": cmd, "shell": True, "done_when": "r.yaml"} for n in "ab"
            ],
        },
    )
    proc = gpuswarm_popen("run", config, "--plain")
    run = wait_for_run(tmp_path / "runs")
    wait_for(lambda: len([e for e in read_events(run) if e["ev"] == "started"]) == 2, 30)
    proc.send(signal.SIGKILL)
    proc.wait(30)
    (tmp_path / "runs" / "go").touch()
    wait_for(lambda: all((run / "tasks" / n / "r.yaml").exists() for n in "ab"), 30)
    time.sleep(0.5)
    res = gpuswarm("work", run, "--gpus", "sim:1", "--plain")
    assert res.returncode == 0, res
    assert task_states(run) == {"a": "done", "b": "done"}
    assert len([e for e in read_events(run) if e["ev"] == "started"]) == 2  # none re-run
    assert descriptor(run, "a")["attempts"][-1]["kind"] == "orphan"


def test_some_tasks_with_a_missing_program_are_named_before_the_run(
    tmp_path: Path, gpuswarm: Gs
) -> None:
    config = write_config(
        tmp_path / "c.yaml",
        {
            "name": "somemissing",
            "gpus": "sim:2",
            "tasks": [
                {"name": "ok", "command": "true"},
                {"name": "bad", "command": "gs-no-such-agent --x"},
            ],
        },
    )
    res = gpuswarm("run", config, "--plain")
    assert res.returncode == 1, res
    assert "warning: command not found: gs-no-such-agent (1 task)" in res.stderr, res
    assert task_states(only_run(tmp_path / "runs")) == {"ok": "done", "bad": "failed"}
