"""Records that must not be lost or misreported (issue 12, items 6, 7 and 9), through the CLI.

- a done/ descriptor truncated to 0 bytes is counted corrupt: resume does not say "all done"
  (exit 1), ls does not say complete, results/summary keep the task, check names it and
  ``check --repair`` sets it aside to corrupt/ with the reason;
- a wrongly typed value in a done/ descriptor, or a journal line that is no JSON object, is
  reported, and report, check, resume and watch go on (no traceback);
- three runs with the same name started in the same second each get their own folder.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_driver import CliResult, cli_argv, cli_env, find_runs, wait_for_run

pytestmark = pytest.mark.slow  # CLI processes: part of CI, not of the fast suite

Cli = Callable[..., CliResult]


def _finished_run(tmp_path: Path, gpuswarm: Cli) -> Path:
    cmds = tmp_path / "c.txt"
    cmds.write_text("echo a\necho b\n")
    res = gpuswarm("run", "-q", "--no-report", "--gpus", "sim:1", "--workspace", "ws", cmds)
    assert res.returncode == 0, str(res)
    return wait_for_run(tmp_path / "ws")


def _done_file(run_dir: Path) -> Path:
    return sorted((run_dir / ".parallel/done").iterdir())[0]


def _no_traceback(res: CliResult) -> CliResult:
    assert "Traceback" not in res.output, str(res)
    return res


def test_empty_done_descriptor_is_counted_corrupt_and_repair_sets_it_aside(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    run_dir = _finished_run(tmp_path, gpuswarm)
    victim = _done_file(run_dir)
    victim.write_bytes(b"")

    ls = _no_traceback(gpuswarm("ls", "ws"))
    assert "complete" not in ls.stdout.replace("unfinished", ""), str(ls)

    res = _no_traceback(gpuswarm("resume", "-q", "--json", "--no-report", run_dir))
    assert res.returncode == 1, str(res)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total"] == 2 and summary["counts"]["corrupt"] == 1, summary
    assert summary["complete"] is False
    tsv = (run_dir / "results.tsv").read_text()
    assert "cmd-00001\t\tcorrupt" in tsv and "empty file" in tsv, tsv

    check = _no_traceback(gpuswarm("check", "--json", run_dir))
    assert check.returncode == 1, str(check)
    found = json.loads(check.stdout)["findings"]
    assert any(f["kind"] == "unreadable" and "empty file" in f["detail"] for f in found), found

    repair = _no_traceback(gpuswarm("check", "--repair", "--json", run_dir))
    assert repair.returncode == 0, str(repair)
    assert not victim.exists()
    aside = [p.name for p in (run_dir / ".parallel/corrupt").iterdir()]
    assert len(aside) == 1 and "empty-file" in aside[0], aside
    assert any(e.get("ev") == "corrupt" for e in map(json.loads, _lines(run_dir)))
    again = _no_traceback(gpuswarm("resume", "-q", "--no-report", run_dir))
    assert again.returncode == 1, str(again)  # still not complete: the task is lost
    assert "complete" not in _no_traceback(gpuswarm("ls", "ws")).stdout.replace("unfinished", "")


def _lines(run_dir: Path) -> list[str]:
    return (run_dir / "events.jsonl").read_text().splitlines()


@pytest.mark.parametrize("field", ["attempts", "task", "result", "duration"])
def test_mistyped_done_descriptor_is_reported_and_every_command_goes_on(
    tmp_path: Path, gpuswarm: Cli, field: str
) -> None:
    run_dir = _finished_run(tmp_path, gpuswarm)
    victim = _done_file(run_dir)
    data = json.loads(victim.read_text())
    if field == "duration":
        data["attempts"][0]["duration"] = "slow"
    else:
        data[field] = {"attempts": "x", "task": 5, "result": [1]}[field]
    victim.write_text(json.dumps(data))

    assert _no_traceback(gpuswarm("report", run_dir)).returncode == 0
    check = _no_traceback(gpuswarm("check", run_dir))
    assert check.returncode == 1 and "cmd-00001" in check.output, str(check)
    watch = _no_traceback(gpuswarm("watch", "--plain", run_dir, timeout=30))
    assert watch.returncode in (0, 1), str(watch)
    res = _no_traceback(gpuswarm("resume", "-q", "--no-report", run_dir))
    assert res.returncode == 1, str(res)
    assert "corrupt" in res.output, str(res)
    assert _no_traceback(gpuswarm("status", run_dir)).returncode == 0


def test_journal_lines_that_are_no_objects_are_reported_and_skipped(
    tmp_path: Path, gpuswarm: Cli
) -> None:
    run_dir = _finished_run(tmp_path, gpuswarm)
    with (run_dir / "events.jsonl").open("a") as fh:
        fh.write('[1, 2]\n"x"\n5\nnull\n{"ev": "finished", "task": 7, "seconds": "x"}\n')
    check = _no_traceback(gpuswarm("check", "--json", run_dir))
    assert check.returncode == 0, str(check)  # reported, but the run's state is consistent
    bad = [f for f in json.loads(check.stdout)["findings"] if f["kind"] == "bad-event"]
    assert len(bad) == 5, bad
    for args in (("report", run_dir), ("watch", "--plain", run_dir), ("status", run_dir)):
        assert _no_traceback(gpuswarm(*args, timeout=30)).returncode == 0
    res = _no_traceback(gpuswarm("resume", "-q", "--no-report", run_dir))
    assert res.returncode == 0, str(res)


def test_same_name_runs_in_the_same_second_get_their_own_folders(tmp_path: Path) -> None:
    cmds = tmp_path / "c.txt"
    cmds.write_text("true\n")
    # --share-gpus: three runs at once on one (simulated) GPU would otherwise be refused
    argv = cli_argv(
        "run", "-q", "--no-report", "--share-gpus", "--gpus", "sim:1", "--workspace", "ws", cmds
    )
    procs = [
        subprocess.Popen(argv, cwd=tmp_path, env=cli_env(), stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    for proc, err in zip(procs, errors, strict=True):
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
    runs = find_runs(tmp_path / "ws")
    assert len(runs) == 3, runs
    for run in runs:
        info = json.loads((run / "run.json").read_text())
        assert info["run_dir"] == run.name, (info["run_dir"], run)
