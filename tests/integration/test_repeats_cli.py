"""Repeated attempts and pass@k through the real CLI (issue 34): ``repeats:``, ``--repeats``,
``{repeat}``, ``score:`` / ``passed:``; summary.json, ``report --json`` and report.html give the
numbers a hand computation gives."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
from cli_driver import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]
PY = sys.executable
EVALUATE = """\
import json, sys
task, j = sys.argv[1], int(sys.argv[2])
ok = j <= 2 if task == "a" else j == 4
speedup = j if task == "a" else 10 * j
json.dump({"ok": ok, "speedup": speedup}, open("result.json", "w"))
"""


def test_repeats_give_mean_ci_and_unbiased_pass_at_k(tmp_path: Path) -> None:
    (tmp_path / "evaluate.py").write_text(EVALUATE)
    cfg = tmp_path / "reps.yaml"
    cfg.write_text(
        "name: reps\nworkspace: ws\n"
        "defaults: {repeats: 4, score: speedup, passed: ok, done_when: result.json,"
        ' cwd: "{workspace}"}\n'
        "tasks:\n"
        f'  - {{name: a, command: [{PY}, "{tmp_path}/evaluate.py", a, "{{repeat}}"]}}\n'
        f'  - {{name: b, command: [{PY}, "{tmp_path}/evaluate.py", b, "{{repeat}}"]}}\n'
    )
    res = run_cli("run", cfg, "--gpus", "sim:2", "--plain", cwd=tmp_path, timeout=80)
    assert res.returncode == 0, res
    (run,) = (tmp_path / "ws/reps").glob("run_*")
    with (run / "results.tsv").open() as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert sorted(r["task"] for r in rows) == [f"{t}-r{j}" for t in "ab" for j in range(1, 5)]
    assert len({(run / "tasks" / r["task"]).resolve() for r in rows}) == 8  # own workspaces
    reps = json.loads((run / "summary.json").read_text())["repeats"]
    a, b = reps["tasks"]["a"], reps["tasks"]["b"]
    # by hand: a's speedups 1, 2, 3, 4; passed in repeats 1 and 2. b's 10..40; passed in 4.
    sd = math.sqrt(5 / 3)  # of 1, 2, 3, 4
    assert a["score"]["mean"] == pytest.approx(2.5)
    assert a["score"]["ci95"] == pytest.approx([2.5 - 3.182 * sd / 2, 2.5 + 3.182 * sd / 2])
    assert b["score"]["ci95"] == pytest.approx([25 - 31.82 * sd / 2, 25 + 31.82 * sd / 2])
    # pass@k = 1 - C(n-c, k) / C(n, k), n = 4
    assert a["passed"]["pass@k"] == pytest.approx({"1": 0.5, "2": 1 - 1 / 6, "3": 1.0, "4": 1.0})
    assert b["passed"]["pass@k"] == pytest.approx({"1": 0.25, "2": 0.5, "3": 0.75, "4": 1.0})
    assert a["passed"]["pass@1"] == 0.5 and b["passed"]["c"] == 1
    agg = reps["aggregate"]
    assert agg["score"]["mean"] == pytest.approx(13.75)
    half = 12.706 * math.sqrt(((2.5 - 13.75) ** 2 + (25 - 13.75) ** 2) / 1) / math.sqrt(2)
    assert agg["score"]["ci95"] == pytest.approx([13.75 - half, 13.75 + half])
    assert agg["pass@1"] == pytest.approx(0.375)
    assert agg["pass@k"]["2"] == pytest.approx(((1 - 1 / 6) + 0.5) / 2)
    report = (run / "report.html").read_text()
    assert "<h2>Repeats</h2>" in report and "pass@2 0.6667" in report
    again = run_cli("report", run, "--json", cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["repeats"] == reps, again


def test_repeats_flag_over_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "reps.yaml"
    cfg.write_text(
        "name: reps\nworkspace: ws\n"
        "tasks:\n"
        '  - {name: t, command: "echo {repeat} > out.txt", shell: true, cwd: "{workspace}"}\n'
    )
    res = run_cli("run", cfg, "--gpus", "sim:1", "--repeats", "3", "--plain", cwd=tmp_path)
    assert res.returncode == 0, res
    (run,) = (tmp_path / "ws/reps").glob("run_*")
    outs = {p.parent.name: p.read_text().strip() for p in (run / "tasks").glob("*/out.txt")}
    assert outs == {"t-r1": "1", "t-r2": "2", "t-r3": "3"}, outs
    reps = json.loads((run / "summary.json").read_text())["repeats"]
    assert reps["tasks"]["t"] == {"repeats": 3, "ended": 3}  # no score: or passed: named


HOME_TASK = """\
import os, pathlib, sys
home, j = pathlib.Path(os.environ["HOME"]), sys.argv[1]
seen = sorted(p.name for p in home.glob("mark-*"))
(home / f"mark-{j}").write_text(j)
pathlib.Path("home.txt").write_text(f"{home}\\n{','.join(seen)}\\n")
sys.exit(0 if seen else 3)  # the first attempt fails: its retry must find its own HOME
"""


def test_each_repeat_has_its_own_private_home_kept_over_its_attempts(tmp_path: Path) -> None:
    (tmp_path / "home_task.py").write_text(HOME_TASK)
    cfg = tmp_path / "reps.yaml"
    cfg.write_text(
        "name: reps\nworkspace: ws\nhome: {isolate: true}\n"
        "reliability: {retry_backoff: null, breaker: {failures: 0}}\n"
        "defaults: {repeats: 3, max_attempts: 2}\n"
        "tasks:\n"
        f'  - {{name: t, command: [{PY}, "{tmp_path}/home_task.py", "{{repeat}}"],'
        ' cwd: "{workspace}"}\n'
    )
    res = run_cli("run", cfg, "--gpus", "sim:1", "--plain", cwd=tmp_path)
    assert res.returncode == 0, res
    (run,) = (tmp_path / "ws/reps").glob("run_*")
    homes = {}
    for j in (1, 2, 3):
        home, seen = (run / "tasks" / f"t-r{j}" / "home.txt").read_text().split()
        assert seen == f"mark-{j}", (j, seen)  # its own first attempt's mark, no other repeat's
        homes[j] = Path(home)
        assert homes[j].stat().st_mode & 0o077 == 0  # private
    assert len(set(homes.values())) == 3, homes  # one slot, three HOMEs
    assert homes[1] == (run / "homes/_repeats/t-r1").absolute()


def test_repeats_flag_on_a_command_list(tmp_path: Path) -> None:
    cmds = tmp_path / "cmds.txt"
    cmds.write_text(
        'echo "r{repeat}" $((10 * {repeat})) > {workspace}/out.txt\n'
        "test {repeat} -ne 2 > {workspace}/out.txt\n"
    )
    res = run_cli("run", "--repeats", "3", cmds, "--gpus", "sim:2", "--plain", cwd=tmp_path)
    assert res.returncode == 1, res  # cmd-00002-r2 fails: test 2 -ne 2
    (run,) = (tmp_path / "runs/cmds").glob("run_*")
    outs = {p.parent.name: p.read_text().strip() for p in (run / "tasks").glob("*-r?/out.txt")}
    assert {k: v for k, v in outs.items() if k.startswith("cmd-00001")} == {
        f"cmd-00001-r{j}": f"r{j} {10 * j}" for j in (1, 2, 3)
    }, outs
    with (run / "results.tsv").open() as f:
        rows = {r["task"]: r for r in csv.DictReader(f, delimiter="\t")}
    assert sorted(rows) == [f"cmd-0000{n}-r{j}" for n in (1, 2) for j in (1, 2, 3)]
    assert rows["cmd-00002-r2"]["state"] == "failed" and rows["cmd-00002-r3"]["state"] == "done"
    assert rows["cmd-00001-r2"]["name"].endswith("-r2"), rows["cmd-00001-r2"]
    reps = json.loads((run / "summary.json").read_text())["repeats"]
    assert sorted(reps["tasks"]) == ["cmd-00001", "cmd-00002"], reps


def test_a_repeats_resume_finds_its_own_home_again(tmp_path: Path) -> None:
    (tmp_path / "home_task.py").write_text(HOME_TASK)
    cfg = tmp_path / "reps.yaml"
    cfg.write_text(
        "name: reps\nworkspace: ws\nhome: {isolate: true}\n"
        "reliability: {breaker: {failures: 0}}\ndefaults: {repeats: 2}\n"
        "tasks:\n"
        f'  - {{name: t, command: [{PY}, "{tmp_path}/home_task.py", "{{repeat}}"],'
        ' cwd: "{workspace}"}\n'
    )
    first = run_cli("run", cfg, "--gpus", "sim:2", "--plain", cwd=tmp_path)
    assert first.returncode == 1, first  # each repeat's only attempt fails, leaving its mark
    (run,) = (tmp_path / "ws/reps").glob("run_*")
    again = run_cli("resume", run, "--gpus", "sim:2", "--plain", cwd=tmp_path)
    assert again.returncode == 0, again  # the retried repeats found their marks
    for j in (1, 2):
        home, seen = (run / "tasks" / f"t-r{j}" / "home.txt").read_text().split()
        assert seen == f"mark-{j}" and Path(home) == (run / f"homes/_repeats/t-r{j}").absolute()
