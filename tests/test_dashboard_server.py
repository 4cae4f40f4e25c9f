"""The dashboard's server without a browser: the guard (token, cookie, Host allowlist, Origin
check, no CORS, CSP), SSE resume by journal offset, the paged task table, read-only, actions
through queue control, and the CLI's start and Ctrl-C with a stream open.

Runs are made with the public facade (``api.create_run``) and fed with queue control's own
functions (``control_ops``), which journal what they do: real journals, no supervisor needed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_driver import run_cli, wait_for
from dashkit import Served, exchange, serve_here, sse_messages, start_dashboard

from gpuswarm.app import api
from gpuswarm.app.control import add_tasks, set_paused
from gpuswarm.config.load import load_command_list
from gpuswarm.core.runview import RunView
from gpuswarm.store import control
from gpuswarm.store.ledger import read_events
from gpuswarm.store.reader import RunReader

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def make_run(workspace: Path, commands: str, name: str = "demo") -> api.RunPaths:
    spec = api.NewRunSpec(
        workspace=workspace,
        folder=name,
        name=name,
        base_dir=workspace,
        gpus=api.plan_gpus("sim:2"),
        source="test",
    )
    run = api.create_run(spec)
    add_tasks(run.root, load_command_list(None, commands, base_dir=workspace))
    return run


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "runs"
    ws.mkdir()
    return ws


@pytest.fixture
def run(workspace: Path) -> api.RunPaths:
    return make_run(workspace, "echo one\necho two\necho '<script>x</script>'\n")


@pytest.fixture
def served(workspace: Path, run: api.RunPaths) -> Iterator[Served]:
    with serve_here([workspace]) as s:
        yield s


def run_id(s: Served) -> str:
    runs = s.get("/api/runs")["runs"]
    assert len(runs) == 1, runs
    rid: str = runs[0]["id"]
    return rid


# -- the guard ---------------------------------------------------------------------------------
def test_token_is_exchanged_for_a_session_no_cookie_carries(served: Served) -> None:
    bare = served.client(session=False)
    page = bare.get("/")  # the page, script and style are public: the package's files
    assert page.status_code == 200 and served.token not in page.text
    assert bare.get("/static/app.js").status_code == 200
    assert bare.get("/api/runs").status_code == 403
    old_cookie = f"gpuswarm_dashboard_{served.port}={served.token}"  # what it used to be
    assert bare.get("/api/runs", headers={"Cookie": old_cookie}).status_code == 403
    assert bare.get("/?token=wrong").status_code == 403
    r = bare.get(f"/?token={served.token}")
    assert r.status_code == 303
    session = r.headers["location"].removeprefix("/#session=")
    assert session != r.headers["location"] and served.token not in r.headers["location"]
    cookie = r.headers["set-cookie"]  # the old token cookie is expired, no new one is set
    assert cookie.startswith(f"gpuswarm_dashboard_{served.port}=;") and "Max-Age=0" in cookie
    assert served.token not in cookie and session not in cookie
    assert bare.get("/api/runs", headers={"X-Gpuswarm-Session": session}).status_code == 200
    assert bare.get("/api/runs", headers={"X-Gpuswarm-Session": served.token}).status_code == 403
    # an EventSource cannot set headers: ?session= counts for a stream's GET only
    assert bare.get(f"/api/runs?session={session}").status_code == 403
    with bare.stream(
        "GET", f"/api/events/runs?session={session}", headers={"Accept": "text/event-stream"}
    ) as stream:
        assert stream.status_code == 200
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert page.headers["x-content-type-options"] == "nosniff"
    assert "<script" in page.text and 'src="/static/app.js"' in page.text
    assert "onclick" not in page.text and "<style" not in page.text  # nothing inline for CSP


def test_each_opening_of_the_url_is_its_own_session(served: Served) -> None:
    first, second = exchange(served.base, served.token), exchange(served.base, served.token)
    assert first != second
    for session in (first, second):
        r = httpx.get(f"{served.base}/api/runs", headers={"X-Gpuswarm-Session": session})
        assert r.status_code == 200


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("/", "/"),
        ("/x", "/x"),
        ("//evil.example/x", "/"),
        ("/\\evil.example/x", "/"),
        ("/%5Cevil.example", "/"),
        ("/%2F%2Fevil.example", "/"),
        ("/a%20b", "/a%20b"),
    ],
)
def test_the_login_redirect_stays_on_this_server(served: Served, path: str, location: str) -> None:
    with httpx.Client(base_url=served.base) as c:
        request = c.build_request("GET", f"{served.base}/?token={served.token}")
        request.url = request.url.copy_with(raw_path=f"{path}?token={served.token}".encode())
        r = c.send(request, follow_redirects=False)
    assert r.status_code == 303, r.text
    assert r.headers["location"].partition("#")[0] == location


def test_a_5000_digit_last_event_id_is_ignored(served: Served) -> None:
    rid = run_id(served)
    c = served.client(timeout=15)
    for bad in ("9" * 5000, "\u00b2", "1" * 19):  # int("²") raises too
        sent = [(b"last-event-id", bad.encode("latin-1"))]
        with c.stream("GET", f"/api/runs/{rid}/events", headers=sent) as r:
            assert r.status_code == 200
            (fresh,) = sse_messages(r, 1)
        assert fresh["event"] == "snapshot"
        with c.stream(
            "GET",
            f"/api/runs/{rid}/tasks/cmd-00001/log",
            headers=[(b"last-event-id", f"1:{bad}".encode("latin-1"))],
        ) as r:
            assert r.status_code == 200
    r = c.get(f"/api/runs/{rid}/tasks", params={"limit": "9" * 5000, "offset": "\u00b2"})
    assert r.status_code == 200 and len(r.json()["rows"]) == 3


def test_foreign_host_is_refused_even_with_the_token(served: Served) -> None:
    c = served.client()
    for host in ("evil.example", f"evil.example:{served.port}", f"10.1.2.3:{served.port}"):
        r = c.get("/api/runs", headers={"Host": host})
        assert r.status_code == 403, host
        assert "not allowed" in r.json()["error"]
    for host in (f"localhost:{served.port}", f"127.0.0.1:{served.port}"):
        assert c.get("/api/runs", headers={"Host": host}).status_code == 200, host
    assert c.get("/api/runs", headers={"Host": "127.0.0.1:1"}).status_code == 403  # other port


def test_actions_need_the_session_header_and_this_origin(served: Served, run: api.RunPaths) -> None:
    rid = run_id(served)
    path = f"/api/runs/{rid}/actions/pause"
    assert served.post(path, {}, **{"X-Gpuswarm-Session": ""}).status_code == 403
    assert served.post(path, {}, **{"X-Gpuswarm-Session": served.token}).status_code == 403
    with_query = served.post(f"{path}?session={served.session}", {}, **{"X-Gpuswarm-Session": ""})
    assert with_query.status_code == 403  # the query never authorises an action
    assert served.post(path, {}, Origin="").status_code == 403
    assert served.post(path, {}, Origin="http://evil.example").status_code == 403
    assert served.post(path, {}, Origin=f"http://localhost:{served.port}").status_code == 403
    assert not control.paused(run).run  # nothing happened
    r = served.post(path, {})
    assert r.status_code == 200, r.text
    assert r.json()["paused"] is True
    assert control.paused(run).run
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}
    preflight = served.client().options(path, headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in {k.lower() for k in preflight.headers}


def test_bad_action_bodies_name_the_field(served: Served) -> None:
    rid = run_id(served)
    r = served.post(f"/api/runs/{rid}/actions/cancel", {"tasks": "cmd-1"})
    assert r.status_code == 400 and "tasks" in r.json()["error"]
    r = served.post(f"/api/runs/{rid}/actions/priority", {"task": "cmd-00001", "priority": "x"})
    assert r.status_code == 400 and "priority" in r.json()["error"]
    r = served.post(f"/api/runs/{rid}/actions/cancel", {"tasks": ["no-such-task"]})
    assert r.status_code == 400 and "no-such-task" in r.json()["error"]
    assert served.post(f"/api/runs/{rid}/actions/explode", {}).status_code == 404


def test_read_only_serves_no_actions(workspace: Path, run: api.RunPaths) -> None:
    with serve_here([workspace], read_only=True) as s:
        rid = run_id(s)
        r = s.post(f"/api/runs/{rid}/actions/cancel", {"tasks": ["cmd-00001"]})
        assert r.status_code == 403 and "read-only" in r.json()["error"]
        assert s.get(f"/api/runs/{rid}")["read_only"] is True
        page = s.client().get("/").text
        assert 'name="gpuswarm-read-only" content="1"' in page
    assert RunReader(run).counts()["pending"] == 3


# -- actions through control_ops ---------------------------------------------------------------
def test_actions_change_the_queue(served: Served, run: api.RunPaths) -> None:
    rid = run_id(served)
    r = served.post(f"/api/runs/{rid}/actions/cancel", {"tasks": ["cmd-00002"]})
    assert r.status_code == 200 and r.json()["tasks"][0]["now"] == "cancelled"
    r = served.post(f"/api/runs/{rid}/actions/priority", {"task": "cmd-00003", "priority": 7})
    assert r.status_code == 200 and r.json()["priority"] == 7
    r = served.post(f"/api/runs/{rid}/actions/add", {"commands": "echo added\n", "timeout": "5m"})
    assert r.status_code == 200 and r.json()["added"] == 1
    r = served.post(f"/api/runs/{rid}/actions/retry", {"tasks": ["cmd-00002"]})
    assert r.status_code == 200 and r.json()["retried"] == 1
    counts = RunReader(run).counts()
    assert counts["pending"] == 4 and counts["cancelled"] == 0
    tasks = wait_for(
        lambda: (t := served.get(f"/api/runs/{rid}/tasks"))["total"] == 4 and t, 5, 0.1
    )
    assert tasks["rows"][0]["id"] == "cmd-00003"  # priority 7 runs first: the queue's order


def test_added_commands_run_through_a_shell_unless_unticked(
    served: Served, run: api.RunPaths, workspace: Path
) -> None:
    """Issue 28: the "Add tasks" box's lines run with /bin/sh -c by default, as a command list
    on the command line does; ``shell: false`` keeps the argv split."""
    rid = run_id(served)
    path = f"/api/runs/{rid}/actions/add"
    piped = "echo hello | tr a-z A-Z > {workspace}/out.txt\n"
    assert served.post(path, {"commands": piped}).json()["ids"] == ["cmd-00001-2"]
    r = served.post(path, {"commands": "echo plain > {workspace}/no.txt\n", "shell": False})
    assert r.json()["ids"] == ["cmd-00001-3"]
    r = served.post(path, {"commands": "true\n", "shell": "yes"})
    assert r.status_code == 400 and "shell" in r.json()["error"]
    res = run_cli("resume", run.root, "--gpus", "sim:1", "-q", "--no-report", cwd=workspace)
    assert res.returncode == 0, res
    assert (run.root / "tasks/cmd-00001-2/out.txt").read_text() == "HELLO\n"
    argv = run.root / "tasks/cmd-00001-3"
    assert not (argv / "no.txt").exists()
    assert "plain > " in (argv / "attempt-1/output.log").read_text()


def test_a_run_pause_is_a_journal_line_readers_fold(run: api.RunPaths) -> None:
    """A pause of the whole run was journaled with ``slot: null``, a line of the wrong shape
    that every reader skipped: watch and the dashboard never showed the run paused."""
    set_paused(run.root, None, paused=True)
    view = RunView.of_journal(read_events(run.events))
    assert view.paused is True
    set_paused(run.root, None, paused=False)
    assert RunView.of_journal(read_events(run.events)).paused is False


# -- SSE ---------------------------------------------------------------------------------------
def test_sse_resumes_from_the_journal_offset(served: Served, run: api.RunPaths) -> None:
    rid = run_id(served)
    c = served.client(timeout=15)
    with c.stream("GET", f"/api/runs/{rid}/events") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        (snap,) = sse_messages(r, 1)
        assert snap["event"] == "snapshot"
        first = int(snap["id"])
        assert first == run.events.stat().st_size
        set_paused(run.root, None, paused=True)
        (update,) = sse_messages(r, 1)
    assert update["event"] == "update"
    evs = update["data"]["events"]
    assert [e["request"] for e in evs] == ["pause"]
    assert update["data"]["view"]["paused"] is True
    second = int(update["id"])
    assert second == run.events.stat().st_size > first
    set_paused(run.root, None, paused=False)  # while no page is connected
    set_paused(run.root, "vm-gpu0", paused=True)
    wait_for(lambda: served.get(f"/api/runs/{rid}")["pos"] == run.events.stat().st_size, 5, 0.05)
    with c.stream("GET", f"/api/runs/{rid}/events", headers={"Last-Event-ID": str(second)}) as r:
        (resumed,) = sse_messages(r, 1)
    assert resumed["event"] == "update"  # exactly what it missed, no snapshot
    assert [(e["request"], e.get("slot")) for e in resumed["data"]["events"]] == [
        ("unpause", None),
        ("pause", "vm-gpu0"),
    ]
    assert int(resumed["id"]) == run.events.stat().st_size
    for bad in ("12", "999999999", "x"):  # not a line's start, past the end, not a number
        with c.stream("GET", f"/api/runs/{rid}/events", headers={"Last-Event-ID": bad}) as r:
            (fresh,) = sse_messages(r, 1)
        assert fresh["event"] == "snapshot", bad


def test_runs_page_stream_lists_runs_started_later(served: Served, workspace: Path) -> None:
    c = served.client(timeout=15)
    with c.stream("GET", "/api/events/runs") as r:
        (first,) = sse_messages(r, 1)
        assert [x["title"] for x in first["data"]["runs"]] == ["demo"]
        make_run(workspace, "echo later\n", name="later")
        (second,) = sse_messages(r, 1)
    assert sorted(x["title"] for x in second["data"]["runs"]) == ["demo", "later"]
    shutil.rmtree(workspace / "later")  # gpuswarm clean, or rm -r: it goes from the page
    wait_for(lambda: [x["title"] for x in served.get("/api/runs")["runs"]] == ["demo"], 10, 0.1)


# -- the task table ----------------------------------------------------------------------------
def test_task_table_is_paged_sorted_and_filtered(workspace: Path) -> None:
    lines = "".join(f"echo task {i}\n" for i in range(1200))
    run = make_run(workspace, lines, name="big")
    with serve_here([run.root]) as s:
        rid = run_id(s)
        base = f"/api/runs/{rid}/tasks"
        page = s.get(f"{base}?limit=50")
        assert page["total"] == 1200 and len(page["rows"]) == 50
        assert page["rows"][0]["id"] == "cmd-00001" and page["rows"][0]["name"] == "echo task 0"
        last = s.get(f"{base}?offset=1180&limit=50")
        assert [r["id"] for r in last["rows"]][-1] == "cmd-01200" and len(last["rows"]) == 20
        desc = s.get(f"{base}?sort=id&dir=desc&limit=3")
        assert [r["id"] for r in desc["rows"]] == ["cmd-01200", "cmd-01199", "cmd-01198"]
        assert s.get(f"{base}?q=cmd-0119&limit=200")["total"] == 10

        def by_name() -> Any:  # every name is read in the background once a name is asked for
            got = s.get(f"{base}?q=echo%20task%2011&limit=200")
            return got["names_known"] and got

        named = wait_for(by_name, 30, 0.2, "every task's name")
        assert named["total"] == 111  # task 11, 110-119, 1100-1199
        top = s.get(f"{base}?sort=name&dir=desc&limit=1")["rows"][0]
        assert top["name"] == "echo task 999"
        s.post(f"/api/runs/{rid}/actions/cancel", {"tasks": ["cmd-00500", "cmd-00007"]})

        def cancelled() -> Any:
            got = s.get(f"{base}?state=cancelled")
            return got["total"] == 2 and got

        got = wait_for(cancelled, 5, 0.1, "the cancels in the table")
        assert [r["id"] for r in got["rows"]] == ["cmd-00007", "cmd-00500"]
        assert s.get(f"{base}?state=pending")["total"] == 1198
        assert s.get(f"{base}?limit=100000")["limit"] == 200  # pages are bounded


def test_task_detail_and_unknown_ids(served: Served) -> None:
    rid = run_id(served)
    d = served.get(f"/api/runs/{rid}/tasks/cmd-00003")
    assert d["name"] == "echo '<script>x</script>'" and d["state"] == "pending"
    assert d["attempts"] == [] and d["logs"] == []
    c = served.client()
    assert c.get(f"/api/runs/{rid}/tasks/nope").status_code == 404
    assert c.get("/api/runs/r000/tasks").status_code == 404
    assert c.get("/api/experiments/x000").status_code == 404


@pytest.mark.slow
def test_log_is_followed_across_attempts_and_resumed(tmp_path: Path, workspace: Path) -> None:
    """A task that fails once then passes: its log stream shows attempt 1's output, then
    attempt 2's, then its end; a page reconnecting mid-way (Last-Event-ID) gets the rest only."""
    marker = tmp_path / "tried"
    (tmp_path / "tasks.txt").write_text(
        f"if [ -e {marker} ]; then echo second try token=ghp_{'a' * 36}; else touch {marker}; "
        "echo first try; exit 3; fi\n"
    )
    res = run_cli(
        "run", "tasks.txt", "--shell", "--max-attempts", "2", "--gpus", "sim:1",
        "--workspace", workspace, "-q", cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res
    with serve_here([workspace]) as s:
        rid = run_id(s)
        c = s.client(timeout=15)
        with c.stream("GET", f"/api/runs/{rid}/tasks/cmd-00001/log") as r:
            msgs = sse_messages(r, 5)
        assert [m["event"] for m in msgs] == ["attempt", "text", "attempt", "text", "end"]
        assert msgs[1]["data"]["text"] == "first try" and msgs[3]["data"]["attempt"] == 2
        assert "second try token=" in msgs[3]["data"]["text"]
        assert "ghp_" not in msgs[3]["data"]["text"]  # redacted by shape
        assert msgs[4]["data"]["state"] == "done"
        resume = msgs[2]["id"]  # attempt 2, nothing of it read yet
        with c.stream(
            "GET", f"/api/runs/{rid}/tasks/cmd-00001/log", headers={"Last-Event-ID": resume}
        ) as r:
            again = sse_messages(r, 3)
        assert [m["event"] for m in again] == ["attempt", "text", "end"]
        assert again[0]["data"]["attempt"] == 2
        detail = s.get(f"/api/runs/{rid}/tasks/cmd-00001")
        assert [a["returncode"] for a in detail["attempts"]] == [3, 0]
        assert detail["logs"] == [1, 2] and detail["state"] == "done"


# -- the command -------------------------------------------------------------------------------
def test_cli_start_does_not_load_the_web_stack(tmp_path: Path) -> None:
    code = (
        "import sys, gpuswarm.cli; print([m for m in ('starlette', 'uvicorn') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    res = run_cli("dashboard", tmp_path / "nowhere", cwd=tmp_path)
    assert res.returncode == 2 and "nowhere: no such folder" in res.stderr
    res = run_cli("dashboard", "--help", cwd=tmp_path)
    assert res.returncode == 0 and "--read-only" in res.stdout and "--bind" in res.stdout


@pytest.mark.slow
def test_ctrl_c_with_an_open_stream_exits_quickly(tmp_path: Path, run: api.RunPaths) -> None:
    dash = start_dashboard(run.root, cwd=tmp_path, log_dir=tmp_path / "_cli_logs")
    assert dash.process is not None
    try:
        c = dash.client(timeout=20)
        rid = run_id(dash)
        with c.stream("GET", f"/api/runs/{rid}/events") as r:
            sse_messages(r, 1)
            t0 = time.monotonic()
            dash.process.send(signal.SIGINT)
            dash.process.popen.wait(10)
            took = time.monotonic() - t0
        assert took < 5, took
        assert "Traceback" not in dash.process.stderr()
    finally:
        dash.process.kill_group()
        dash.close()


def test_every_answer_is_json_or_the_page(served: Served) -> None:
    c = served.client()
    r = c.get("/api/runs")
    assert r.headers["content-type"].startswith("application/json")
    json.loads(r.text)
    assert c.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert c.get("/static/nope.js").status_code == 404
    assert isinstance(httpx.__version__, str)
