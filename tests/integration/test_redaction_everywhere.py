"""One redactor for every output (issue 30, item 5), through the real CLI and the dashboard.

Secrets are planted where a run gets them: the supervisor's environment, a task's env, a
provisioned credential file, a task's name (either secret inside it), JSON and YAML pairs a task
prints, a result file a task writes. None may reach a file gpuswarm writes for people (run.json,
events.jsonl, results.tsv, summary.json, report.html), ``status`` (``--json`` too), or any
answer of the dashboard (the run, its events, its task table, each task and each task's log),
nor what ``gpuswarm logs`` prints (plain, ``--json``, ``-f``).
The queue (``.parallel/``) keeps the real commands and env (a resume runs them) and a task's
own log, workspace and slot HOME are the task's: those are not looked at.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_driver import CliResult, find_runs
from dashkit import serve_here, sse_messages

pytestmark = pytest.mark.slow  # CLI processes: part of CI, not of the fast suite
pytest.importorskip("starlette")

Cli = Callable[..., CliResult]
MARK = "Pl4nted"  # every planted secret holds it; nothing else does
SUPERVISOR = f"{MARK}SupervisorValue1"
TASK_ENV = f"{MARK}TaskEnvValue2"
PROVISIONED = f"{MARK}ProvisionedValue3"
JSON_PAIR = f"{MARK}JsonPairValue4"
YAML_PAIR = f"{MARK}YamlPairValue5"
RESULT = f"{MARK}ResultValue6"


def _config(tmp_path: Path) -> Path:
    cred = tmp_path / "login" / "cred.json"
    cred.parent.mkdir()
    cred.write_text(json.dumps({"oauth": {"access_token": PROVISIONED, "expires": 3600}}))
    script = tmp_path / "task.sh"
    script.write_text(
        textwrap.dedent(
            f"""\
            echo "env: sup=$SUPERVISOR_TOKEN task=$MY_API_KEY"
            cat "$HOME/.config/tool/cred.json"; echo
            python3 -c "import json, os
            doc = json.load(open(os.path.expanduser('~/.config/tool/cred.json')))
            print('raw', doc['oauth']['access_token'])"
            echo '{{"password": "{JSON_PAIR}", "ok": 1}}'
            echo 'api_key: {YAML_PAIR}'
            printf '{{"api_key": "{RESULT}", "note": "%s", "ok": true}}' "$SUPERVISOR_TOKEN" \\
              > "$1/result.json"
            echo "the end: $MY_API_KEY"
            exit "$2"
            """
        )
    )
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""\
            home:
              isolate: true
              provision:
                - {{src: {cred}, dest: .config/tool/cred.json}}
            defaults:
              env: {{MY_API_KEY: {TASK_ENV}}}
              done_when: result.json
              shell: true
            tasks:
              - name: "train-{SUPERVISOR}"
                command: "sh {script} {{workspace}} 1"
              - name: "eval {TASK_ENV}"
                command: "sh {script} {{workspace}} 0 # {TASK_ENV}"
            """
        )
    )
    return cfg


def _written_files(run: Path) -> Iterator[Path]:
    """Every file gpuswarm wrote for people: all but the queue, the tasks' own folders and the
    slot HOMEs (the provisioned copies are the tasks')."""
    for path in run.rglob("*"):
        rel = path.relative_to(run).parts
        if path.is_file() and rel[0] not in (".parallel", "tasks", "homes"):
            yield path


def _no_secret(where: str, text: str) -> None:
    at = text.find(MARK)
    assert at < 0, f"a planted secret reached {where}: ...{text[max(0, at - 80) :][:200]}"


def test_planted_secrets_reach_no_file_view_or_dashboard_answer(
    tmp_path: Path, gpuswarm: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"SUPERVISOR_TOKEN": SUPERVISOR}
    result = gpuswarm("run", _config(tmp_path), "--gpus", "sim:2", "--plain", env=env)
    assert result.returncode == 1, result  # the train task fails on purpose: its tail is shown
    _no_secret("the run's output", result.output)
    (run,) = find_runs(tmp_path / "runs")
    logs = "".join(p.read_text() for p in (run / "tasks").rglob("output.log"))
    for secret in (SUPERVISOR, TASK_ENV, PROVISIONED, JSON_PAIR, YAML_PAIR):
        assert secret in logs  # the task really printed each (its own log keeps them)
    written = sorted(_written_files(run))
    names = {p.name for p in written}
    assert {"run.json", "events.jsonl", "results.tsv", "summary.json", "report.html"} <= names
    for path in written:
        _no_secret(str(path.relative_to(run)), path.read_text(errors="replace"))
    assert "result.ok" in (run / "results.tsv").read_text()  # result fields are still there
    for args in (["status", run], ["status", run, "--json"]):
        shown = gpuswarm(*args, env=env)
        assert shown.returncode in (0, 1), shown
        _no_secret(" ".join(map(str, args[:1] + args[2:])), shown.output)
    assert "api_key: ***" in gpuswarm("status", run, env=env).output  # the failure's tail
    tids = sorted(p.name for p in (run / "tasks").iterdir())
    for tid in tids:  # `gpuswarm logs` prints the task's output through the same redactor
        for extra in ([], ["--json"], ["-f"]):
            shown = gpuswarm("logs", run, tid, *extra, env=env)
            assert shown.returncode == 0, shown
            assert "the end: ***" in shown.stdout, shown
            _no_secret(f"logs {tid} {' '.join(extra)}", shown.output)

    monkeypatch.setenv("SUPERVISOR_TOKEN", SUPERVISOR)  # the dashboard runs where status does
    with serve_here([tmp_path / "runs"]) as served:
        c = served.client(timeout=15)
        answers = {"/api/runs": c.get("/api/runs").text}
        rid = json.loads(answers["/api/runs"])["runs"][0]["id"]
        for api in (f"/api/runs/{rid}", f"/api/runs/{rid}/tasks"):
            answers[api] = c.get(api).text
        tasks = [row["id"] for row in json.loads(answers[f"/api/runs/{rid}/tasks"])["rows"]]
        assert len(tasks) == 2, tasks
        for tid in tasks:
            answers[tid] = c.get(f"/api/runs/{rid}/tasks/{tid}").text
            with c.stream("GET", f"/api/runs/{rid}/tasks/{tid}/log") as r:
                log = sse_messages(r, 3)  # attempt, its text, the end
            assert [m["event"] for m in log] == ["attempt", "text", "end"], log
            assert "the end: ***" in log[1]["data"]["text"]
            answers[f"{tid} log"] = json.dumps(log)
        with c.stream("GET", f"/api/runs/{rid}/events") as r:
            answers["run events"] = json.dumps(sse_messages(r, 1))
    for where, text in answers.items():
        assert text and '"error"' not in text[:20], (where, text)
        _no_secret(f"the dashboard's {where}", text)
