"""Scenario 7: hostile tasks. Each leaves something poisonous where gpuswarm reads: a FIFO at its
completion file or at its own output.log, a symlink to a file outside the run (a log of the next
attempt, /etc/os-release, a secret, /dev/zero), a placeholder value that climbs out of the
workspace, a result file that is a recursive YAML alias or nested 20,000 deep; plus a 30-day
timeout. The run must never hang or crash: each poison is its own attempt's failure (counted
against ``max_attempts``), the healthy tasks finish, nothing outside the run is written, and no
byte of a file outside the workspace reaches results.tsv, summary.json or report.html; status,
report and check of the run answer (no hang, no traceback).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_driver import CliResult, wait_for_run
from harness import PY, write_config
from invariants import check_run

pytestmark = pytest.mark.slow

WS = '"$GPUSWARM_TASK_WORKSPACE"'
SECRET = "SECRET-9f3c1a77e2"


def sh(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "shell": True, **extra}


def py_writes(rel: str, expr: str) -> str:
    """A shell command: python writes ``expr`` (no braces: they are placeholders) to ``rel``."""
    code = f"import os; open(os.environ['GPUSWARM_TASK_WORKSPACE'] + '/{rel}', 'w').write({expr})"
    return f"{shlex.quote(PY)} -c {shlex.quote(code)}"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(240)
def test_hostile_tasks_never_hang_crash_or_leak(
    tmp_path: Path, cli: Callable[..., CliResult], figures: Callable[..., None]
) -> None:
    outside = tmp_path / "outside.log"
    outside.write_bytes(b"o" * (4200 * 1024))  # 4.2 MB, more than the 1 MiB log cap
    before = digest(outside)
    secret = tmp_path / "secret.yaml"
    secret.write_text(f"token: {SECRET}\n")
    os_release = Path("/etc/os-release").read_text().strip().splitlines()
    plant = (
        f'if [ "$GPUSWARM_ATTEMPT" = 1 ]; then mkdir -p {WS}/attempt-2 && '
        f'ln -s "$OUTSIDE" {WS}/attempt-2/output.log; exit 1; fi; '
        "head -c 3000000 /dev/zero | tr '\\0' y; echo; echo second attempt"
    )
    fifo_log = (
        f'L={WS}/attempt-$GPUSWARM_ATTEMPT/output.log; echo "CUDA out of memory"; '
        'rm -f "$L"; mkfifo "$L"; exit 1'
    )
    deep = "'[' * 20000 + ']' * 20000"
    tasks = [
        sh("ok-1", "echo fine"),
        sh("ok-2", py_writes("r.json", "'[1, 2]'"), done_when="r.json"),
        sh("fifo-done", f"mkfifo {WS}/result.json", done_when="result.json"),
        sh("fifo-log", fifo_log),
        sh("plant-log", plant, max_attempts=2, env={"OUTSIDE": str(outside)}),
        sh("link-etc", f"ln -s /etc/os-release {WS}/result.json", done_when="result.json"),
        sh("link-secret", f"ln -s {shlex.quote(str(secret))} {WS}/r.yaml", done_when="r.yaml"),
        sh("dev-zero", f"ln -s /dev/zero {WS}/r.json", done_when="r.json"),
        sh("anchor", f"printf '&a [*a]\\n' > {WS}/r.yaml", done_when="r.yaml", max_attempts=2),
        sh("deep-json", py_writes("r.json", deep), done_when="r.json"),
        sh("deep-yaml", py_writes("r.yaml", deep), done_when="r.yaml"),
        sh("huge-timeout", "echo fine", timeout="30d"),
        {
            "matrix": {"rel": ["../../../../../secret.yaml"]},
            "name": "climb",
            "command": "true",
            "done_when": "{rel}",
        },
    ]
    top = {
        "name": "hostile",
        "workspace": "ws",
        "gpus": "sim:3",
        "grace": "0.5s",
        "reliability": {"retry_backoff": "0.1s", "breaker": {"failures": 0}, "max_log_mb": 1},
    }
    config = write_config(tmp_path, top, tasks)
    res = cli("run", "-q", config, timeout=120)
    assert res.returncode == 1, str(res)
    assert "Traceback" not in res.output, str(res)
    run_dir = wait_for_run(tmp_path / "ws")
    ids = sorted(p.name for p in (run_dir / "tasks").iterdir())
    climb = next(i for i in ids if i.startswith("climb"))
    rep = check_run(run_dir, ids)
    expected = {i: "failed" for i in ids}
    expected.update({"ok-1": "done", "ok-2": "done", "plant-log": "done", "huge-timeout": "done"})
    assert rep.states == expected, rep.states
    d = rep.descriptors
    reasons = {i: str(d[i]["reason"]) for i in ids if expected[i] == "failed"}
    assert "FIFO" in reasons["fifo-done"], reasons
    assert reasons["fifo-log"].startswith("exit 1"), reasons  # a FIFO is no log to read
    for tid in ("link-etc", "link-secret", "dev-zero", climb):
        assert "outside the task workspace" in reasons[tid], (tid, reasons[tid])
    assert "nested more than" in reasons["anchor"], reasons
    assert len(d["anchor"]["attempts"]) == 2, d["anchor"]  # counted against max_attempts
    for tid in ("deep-json", "deep-yaml"):
        assert "nested" in reasons[tid], (tid, reasons[tid])
    assert d["ok-2"]["result"] == {"value": "1,2"}, d["ok-2"]

    # the planted symlink was never followed: the outside file is untouched, attempt 2 has its
    # own log (capped: 3 MB written, 1 MiB kept)
    assert digest(outside) == before, "the planted symlink was followed"
    log2 = run_dir / "tasks/plant-log/attempt-2/output.log"
    assert not log2.is_symlink() and log2.stat().st_size <= 1 << 20
    assert log2.read_bytes().endswith(b"second attempt\n")

    # nothing of a file outside the workspace reached the outputs
    for name in ("results.tsv", "summary.json", "report.html", "events.jsonl"):
        text = (run_dir / name).read_text(errors="replace")
        assert SECRET not in text, name
        for line in os_release:  # KEY=VALUE lines; PRETTY_NAME's value is distinctive
            assert line not in text, (name, line)
            if line.startswith("PRETTY_NAME="):
                assert line.split("=", 1)[1].strip('"') not in text, (name, line)

    # the views answer about such a run
    for args in (("status", run_dir), ("report", run_dir), ("check", run_dir), ("ls", "ws")):
        out = cli(*args, timeout=30)
        assert out.returncode in (0, 1), str(out)
        assert "Traceback" not in out.output, str(out)
    figures(
        "7 hostile tasks in one run",
        tasks=len(ids),
        faults=len(ids) - 3,
        lost=len(rep.lost),
        orphans=len(rep.orphans),
        duplicates=len(rep.duplicates),
    )


def test_absurd_timeout_is_bad_input(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    top = {"name": "absurd", "workspace": "ws", "gpus": "sim:1"}
    config = write_config(tmp_path, top, [sh("t", "true", timeout="400d")])
    res = cli("run", "-q", config)
    assert res.returncode == 2, str(res)
    assert "tasks[0].timeout" in res.stderr and "365 days" in res.stderr, str(res)
    assert not (tmp_path / "ws").exists()
