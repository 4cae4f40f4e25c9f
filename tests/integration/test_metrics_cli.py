"""Issue 37, part 1: ``/metrics`` through the real CLI.

- a finished run's exposition (``gpuswarm exporter``) parses with prometheus_client's own
  parser, passes ``promtool check metrics``, says the counts the run ended with, and carries no
  task id in any label;
- a real Prometheus server scrapes a live run (the exporter, and the dashboard with the bearer
  token) and a PromQL query over its HTTP API returns the done count;
- the dashboard's ``/metrics`` takes the token only as ``Authorization: Bearer``: no session,
  no cookie, no query token.
"""

from __future__ import annotations

import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_driver import CliProcess, run_cli, start_cli, wait_for, wait_for_run
from prometheus_client.parser import text_string_to_metric_families
from promkit import prometheus, promtool_check, wait_value

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _config(base: Path, tasks: list[dict[str, Any]], name: str = "m") -> Path:
    config = {
        "name": name,
        "gpus": "sim:2",
        "reliability": {"retry_backoff": "0.1s"},
        "defaults": {"max_attempts": 2},
        "tasks": tasks,
    }
    path = base / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _exporter(base: Path, *args: str, env: dict[str, str] | None = None) -> tuple[CliProcess, str]:
    proc = start_cli("exporter", *args, "--port", "0", cwd=base, log_dir=base / "logs", env=env)

    def url() -> str | None:
        if not proc.alive():
            raise AssertionError(f"exporter exited: {proc.stderr()}")
        out = proc.stdout().strip()
        return out.splitlines()[0] if out else None

    return proc, wait_for(url, 30, 0.05, "the exporter's URL")


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


@pytest.fixture
def stop_all() -> Iterator[list[CliProcess]]:
    procs: list[CliProcess] = []
    yield procs
    for p in procs:
        p.send(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except Exception:
            p.kill_group()


def test_finished_run_exposition_parses_and_passes_promtool(
    tmp_path: Path, stop_all: list[CliProcess]
) -> None:
    tasks = [{"name": f"ok{i}", "command": "sleep 0.1", "shell": True} for i in range(4)]
    tasks.append({"name": "secret-task-name", "command": "exit 3", "shell": True})
    res = run_cli("run", _config(tmp_path, tasks), "--plain", cwd=tmp_path, timeout=120)
    assert res.returncode == 1, res
    run = wait_for_run(tmp_path / "runs")
    label = f"{run.parent.name}/{run.name}"

    proc, url = _exporter(tmp_path, str(tmp_path / "runs"))
    stop_all.append(proc)
    status, text = _get(url)
    assert status == 200, text
    samples = _samples(text)  # prometheus_client's own parser
    assert samples[("gpuswarm_tasks", frozenset({("run", label), ("state", "done")}))] == 4
    assert samples[("gpuswarm_tasks", frozenset({("run", label), ("state", "failed")}))] == 1
    ended = ("gpuswarm_attempts_ended_total", frozenset({("run", label), ("outcome", "retried")}))
    assert samples[ended] == 1  # the failing task's first attempt
    assert samples[("gpuswarm_attempts_started_total", frozenset({("run", label)}))] == 6
    exits = ("gpuswarm_attempt_ends_total", frozenset({("run", label), ("kind", "exited")}))
    assert samples[exits] == 6
    assert samples[("gpuswarm_slot_idle_gap_seconds_count", frozenset({("run", label)}))] >= 3
    # label policy: no task ids or names in any label
    values = {v for (_, labels) in samples for _, v in labels}
    assert not any(v.startswith("ok") or "secret" in v for v in values), values
    checked = promtool_check(text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == "", checked


def test_exporter_token_is_a_bearer(tmp_path: Path, stop_all: list[CliProcess]) -> None:
    (tmp_path / "runs").mkdir()
    proc, url = _exporter(
        tmp_path, "runs", "--token-env", "SCRAPE_TOKEN", env={"SCRAPE_TOKEN": "s3cret-t0ken"}
    )
    stop_all.append(proc)
    assert _get(url)[0] == 401
    assert _get(url, {"Authorization": "Bearer wrong"})[0] == 401
    status, text = _get(url, {"Authorization": "Bearer s3cret-t0ken"})
    assert status == 200 and "gpuswarm_source_errors 0.0" in text, text
    missing = run_cli("exporter", "runs", "--token-env", "NOPE_UNSET", cwd=tmp_path)
    assert missing.returncode == 2 and "NOPE_UNSET" in missing.stderr, missing
    nothing = run_cli("exporter", "nowhere", cwd=tmp_path)
    assert nothing.returncode == 2 and "nowhere: no such folder" in nothing.stderr, nothing


def test_prometheus_scrapes_a_live_run(tmp_path: Path, stop_all: list[CliProcess]) -> None:
    """A real Prometheus scrapes the exporter and the dashboard (bearer token) of a live run:
    PromQL over its HTTP API says 5 done while the run still runs its last task."""
    gate = tmp_path / "gate"
    tasks: list[dict[str, Any]] = [
        {"name": f"t{i}", "command": "sleep 0.05", "shell": True} for i in range(5)
    ]
    hold = f"while [ ! -e {gate} ]; do sleep 0.1; done"
    tasks.append({"name": "hold", "command": hold, "shell": True, "priority": -10})
    run_proc = start_cli(
        "run", _config(tmp_path, tasks), "--plain", cwd=tmp_path, log_dir=tmp_path / "logs"
    )
    stop_all.append(run_proc)
    run = wait_for_run(tmp_path / "runs")
    label = f"{run.parent.name}/{run.name}"
    exporter, url = _exporter(tmp_path, str(tmp_path / "runs"))
    stop_all.append(exporter)
    dash = start_cli(
        "dashboard", str(tmp_path / "runs"), "--port", "0", cwd=tmp_path, log_dir=tmp_path / "dlogs"
    )
    stop_all.append(dash)
    dash_url = wait_for(lambda: dash.stdout().strip(), 30, 0.05, "the dashboard's URL")
    host, token = dash_url.split("/")[2], dash_url.split("token=")[1].strip()
    target = url.split("/")[2]
    jobs: list[dict[str, Any]] = [
        {"job_name": "exporter", "static_configs": [{"targets": [target]}]},
        {
            "job_name": "dashboard",
            "static_configs": [{"targets": [host]}],
            "authorization": {"type": "Bearer", "credentials": token},
        },
    ]
    with prometheus(tmp_path / "prom", jobs) as server:
        for job in ("exporter", "dashboard"):
            q = f'gpuswarm_tasks{{job="{job}",run="{label}",state="done"}}'
            assert wait_value(server, q, 5.0) == 5.0
            live = f'gpuswarm_run_live{{job="{job}",run="{label}"}}'
            assert wait_value(server, live, 1.0) == 1.0
        gate.touch()
        assert run_proc.wait(60).returncode == 0
        q = f'gpuswarm_tasks{{job="exporter",run="{label}",state="done"}}'
        assert wait_value(server, q, 6.0) == 6.0


def test_dashboard_metrics_take_only_the_bearer_token(
    tmp_path: Path, stop_all: list[CliProcess]
) -> None:
    pytest.importorskip("starlette")
    (tmp_path / "runs").mkdir()
    dash = start_cli("dashboard", "runs", "--port", "0", cwd=tmp_path, log_dir=tmp_path / "l")
    stop_all.append(dash)
    url = wait_for(lambda: dash.stdout().strip(), 30, 0.05, "the dashboard's URL")
    base, token = url.split("/?")[0], url.split("token=")[1].strip()
    metrics = f"{base}/metrics"
    assert _get(metrics)[0] == 401
    assert _get(f"{metrics}?token={token}")[0] == 401  # never the query's token
    assert (
        _get(metrics, {"Cookie": f"gpuswarm_dashboard_{base.rsplit(':', 1)[1]}={token}"})[0] == 401
    )
    assert _get(metrics, {"Authorization": f"Bearer {token}x"})[0] == 401
    from dashkit import exchange

    session = exchange(base, token)  # a page's session opens the API, never /metrics
    assert _get(f"{base}/api/runs", {"X-Gpuswarm-Session": session})[0] == 200
    assert _get(metrics, {"X-Gpuswarm-Session": session})[0] == 401
    status, text = _get(metrics, {"Authorization": f"Bearer {token}"})
    assert status == 200 and "# TYPE gpuswarm_tasks gauge" in text, text
    assert _get(metrics, {"Authorization": f"Bearer {token}", "Host": "evil.example"})[0] == 403
