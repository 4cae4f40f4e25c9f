"""Issue 37, part 2: webhooks through the real CLI, against a real local HTTP receiver."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_driver import run_cli, wait_for_run
from hookkit import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
SECRET = "whsec-0123456789abcdef"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _config(base: Path, tasks: list[dict[str, Any]], notify: dict[str, Any] | None) -> Path:
    config: dict[str, Any] = {"name": "n", "gpus": "sim:2", "tasks": tasks}
    if notify is not None:
        config["notify"] = notify
    path = base / "n.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _journal(run: Path) -> list[dict[str, Any]]:
    path = run / ".parallel" / "notify.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_events_signed_rate_limited_and_journaled(tmp_path: Path, receiver: Receiver) -> None:
    tasks: list[dict[str, Any]] = [
        {"name": f"bad{i}", "command": "echo API_TOKEN=$API_TOKEN; exit 3", "shell": True}
        for i in range(6)
    ]
    tasks.append({"name": "ok", "command": "true", "shell": True})
    notify = {
        "url": receiver.url,
        "signature_env": "HOOK_SECRET",
        "failed_first": 2,
        "failed_every": 2,
        "dashboard": "http://127.0.0.1:8765",
    }
    env = {"HOOK_SECRET": SECRET, "API_TOKEN": "tok-abcdef123456"}
    res = run_cli("run", _config(tmp_path, tasks, notify), "--plain", cwd=tmp_path, env=env)
    assert res.returncode == 1, res
    events = receiver.events()
    kinds = [e["event"] for e in events]
    assert kinds.count("task_failed") == 4, kinds  # 2 one by one, then at 4 and 6
    assert kinds[-1] == "run_finished", kinds
    last = events[-1]
    assert last["counts"]["failed"] == 6 and last["counts"]["done"] == 1, last
    assert last["dashboard"].startswith("http://127.0.0.1:8765/#/run/r"), last
    assert last["run"].startswith("n/run_")
    summaries = [e for e in events if e["event"] == "task_failed" and "task" not in e]
    assert [e["failed"] for e in summaries] == [4, 6]
    for headers, body in receiver.got:  # every body signed with the secret, none holds it
        mac = hmac.new(
            SECRET.encode(), headers["x-gpuswarm-timestamp"].encode() + b"." + body, hashlib.sha256
        )
        assert headers["x-gpuswarm-signature"] == "sha256=" + mac.hexdigest()
        assert SECRET.encode() not in body and b"tok-abcdef123456" not in body
    run = wait_for_run(tmp_path / "runs")
    from gpuswarm.dashboard.catalog import ident

    assert last["dashboard"].endswith(f"#/run/{ident('r', run.resolve())}")  # the run's page
    journal = _journal(run)
    assert [j["outcome"] for j in journal] == ["delivered"] * len(events)
    assert all(receiver.url not in json.dumps(j) for j in journal)


def test_notify_flag_slack_format(tmp_path: Path, receiver: Receiver) -> None:
    tasks = [{"name": "ok", "command": "true", "shell": True}]
    cfg = _config(tmp_path, tasks, {"url_env": "UNUSED_HOOK", "format": "slack"})
    res = run_cli("run", cfg, "--plain", "--notify", receiver.url, cwd=tmp_path)
    assert res.returncode == 0, res
    (body,) = receiver.events()
    assert body["text"].startswith("gpuswarm n/run_") and "finished: 1 done" in body["text"]
    assert body["attachments"][0]["fields"] == [{"title": "done", "value": "1", "short": True}]
    bad = run_cli("run", cfg, "--notify", "ftp://x", cwd=tmp_path)
    assert bad.returncode == 2 and "--notify ftp://x" in bad.stderr, bad


def test_a_hanging_receiver_bounds_the_end(tmp_path: Path) -> None:
    """A receiver that hangs 30 s: the run's end waits end_wait (1 s) and the delivery is
    journaled dropped; one that refuses connections: retried, then given up, same bound."""
    hang = Receiver(hang=30.0)
    try:
        tasks = [{"name": f"t{i}", "command": "true", "shell": True} for i in range(4)]
        notify = {"url": hang.url, "timeout": "30s", "end_wait": "1s"}
        t0 = time.monotonic()
        res = run_cli(
            "run", _config(tmp_path, tasks, notify), "--plain", "--no-report", cwd=tmp_path
        )
        took = time.monotonic() - t0
        assert res.returncode == 0, res
        assert took < 25, took  # not the receiver's 30 s
        journal = _journal(wait_for_run(tmp_path / "runs"))
        assert journal and journal[-1]["outcome"] == "dropped", journal
    finally:
        hang.close()

    refused = tmp_path / "refused"
    refused.mkdir()
    port = hang.server.server_address[1]  # closed now: connections are refused
    notify2: dict[str, Any] = {"url": f"http://127.0.0.1:{port}/x", "retries": 2, "end_wait": "1s"}
    res = run_cli("run", _config(refused, tasks, notify2), "--plain", "--no-report", cwd=refused)
    assert res.returncode == 0, res
    journal = _journal(wait_for_run(refused / "runs"))
    assert journal[0]["outcome"] == "retrying" and "Connection" in journal[0]["detail"], journal
    assert journal[-1]["outcome"] in ("dropped", "failed"), journal


def test_a_bad_notify_block_is_exit_2_naming_the_field(tmp_path: Path) -> None:
    tasks = [{"name": "ok", "command": "true", "shell": True}]
    for notify, says in (
        ({"url": "ftp://x"}, "notify.url"),
        ({"url": "http://x", "url_env": "HOOK"}, "one of them"),
        ({"url": "http://x", "events": ["run_done"]}, "unknown event 'run_done'"),
    ):
        res = run_cli("run", _config(tmp_path, tasks, notify), cwd=tmp_path)
        assert res.returncode == 2 and says in res.stderr, res
        assert not (tmp_path / "runs").exists()  # nothing half-written
