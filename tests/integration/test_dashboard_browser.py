"""The dashboard in a real browser (Debian's chromium driven by Playwright), against real runs:
``gpuswarm run`` and ``gpuswarm research`` in subprocesses on simulated GPUs, and the real
``gpuswarm dashboard`` CLI.

One browser per module (``browser``); each test opens its own page. Runs wait for gate files
the test creates, so nothing depends on timing; DOM changes are polled with generous timeouts.
Screenshots of each page are written under the test's tmp folder (``shots/``) and copied to
``$GPUSWARM_SHOTS_DIR`` when it is set.
"""

from __future__ import annotations

import itertools
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from cli_driver import CliProcess, CliResult, read_events, wait_for, wait_for_run
from dashkit import (
    REBIND_HOST,
    Served,
    browser_context,
    require_browser,
    screenshot,
    start_dashboard,
)
from integration_support import edit_constant

from gpuswarm.core.paths import RunPaths
from gpuswarm.research.experiment import ExpPaths
from gpuswarm.research.journal import replay
from gpuswarm.research.plot import running_best
from gpuswarm.research.readouts import plot_rows
from gpuswarm.store import control
from gpuswarm.store.reader import RunReader

pytestmark = [pytest.mark.browser, pytest.mark.slow]

Cli = Callable[..., CliResult]
Popen = Callable[..., CliProcess]
PY = sys.executable
WAIT_MS = 15_000  # DOM polls: generous (a loaded 2-core CI machine), never a timing assertion


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_browser()
    with browser_context(tmp_path_factory.mktemp("chromium-profile")) as ctx:
        yield ctx


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    p = browser.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    yield p
    p.close()
    assert not errors, errors  # no script error on any page


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start ``gpuswarm dashboard PATHS`` (the real CLI); stopped at teardown."""
    started: list[Served] = []

    def start(*paths: Path | str) -> Served:
        served = start_dashboard(*paths, cwd=tmp_path, log_dir=tmp_path / "_dash_logs")
        started.append(served)
        return served

    yield start
    for served in started:
        assert served.process is not None
        served.process.kill_group()
        served.close()


def gated_commands(tmp_path: Path, *names: str) -> Path:
    """A command list whose task i waits for gate file ``names[i]``, printing as it waits."""
    lines = []
    for name in names:
        gate = shlex.quote(str(tmp_path / "gates" / name))
        wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
        lines.append(f"echo waiting for {name}; {wait}; echo passed {name}")
    (tmp_path / "gates").mkdir(exist_ok=True)
    path = tmp_path / "tasks.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def open_run(page: Any, served: Served) -> str:
    rid = wait_for(lambda: (r := served.get("/api/runs")["runs"]) and r[0]["id"], 20, 0.1)
    page.goto(served.url)  # the token URL: the cookie, then the page without the token
    page.wait_for_selector(f"[data-run='{rid}'] a", timeout=WAIT_MS)
    page.click(f"[data-run='{rid}'] a")
    page.wait_for_selector("[data-slot]", timeout=WAIT_MS)
    return str(rid)


TAB_AND_HEAD = """() => [
  document.querySelector("#run-head [data-count='done'] b").textContent,
  document.querySelector("[data-filter=done]").textContent]"""


OVERLAPS = """() => {
  const boxes = [...document.querySelectorAll('[data-testid=chart] text.label')]
    .map((t) => t.getBoundingClientRect());
  return boxes.some((a, i) => boxes.some((b, j) => i < j && a.left < b.right && b.left < a.right
    && a.top < b.bottom && b.top < a.bottom));
}"""


# the page's own chart function on 30 kept changes a step apart (labels that would all overlap):
# how many labels it draws, and whether any two overlap
CROWDED = """() => {
  const rows = [...Array(30).keys()].map((i) => ({ n: i + 1, id: `v${i + 1}`, kind: 'variant',
    metric: 1 - i * 0.001, status: 'keep', description: `a kept change, number ${i + 1}` }));
  const box = document.createElement('div');
  box.style.width = '1000px';
  box.append(progressChart({ rows, metric: 'm', goal: 'min', best_steps: [] }, 1000));
  document.body.append(box);
  const rects = [...box.querySelectorAll('text.label')].map((t) => t.getBoundingClientRect());
  box.remove();
  const overlap = rects.some((a, i) => rects.some((b, j) => i < j && a.left < b.right
    && b.left < a.right && a.top < b.bottom && b.top < a.bottom));
  return [rects.length, overlap];
}"""


def chart_ticks(page: Any) -> str | None:
    found: str | None = page.locator("[data-testid=chart] svg").get_attribute("data-ticks")
    return found


def count_of(page: Any, state: str) -> int:
    text = page.locator(f"#run-head [data-count='{state}'] b").inner_text(timeout=WAIT_MS)
    return int(text)


def test_live_run_lanes_and_counts_follow_the_journal(
    tmp_path: Path,
    gpuswarm_popen: Popen,
    page: Any,
    dashboard: Callable[..., Served],
) -> None:
    tasks = gated_commands(tmp_path, "g1", "g2", "g3")
    runner = gpuswarm_popen("run", tasks, "--shell", "--gpus", "sim:2", "--workspace", "runs", "-q")
    run = RunPaths(wait_for_run(tmp_path / "runs"))
    served = dashboard(tmp_path / "runs")
    page.goto(served.url)
    page.wait_for_selector("[data-testid=runs-table] [data-state=live]", timeout=WAIT_MS)
    screenshot(page, "runs", tmp_path / "shots")
    open_run(page, served)
    page.wait_for_function("document.querySelectorAll('.lane.busy').length === 2", timeout=WAIT_MS)
    assert count_of(page, "running") == 2 and count_of(page, "pending") == 1
    lane = page.locator(".lane[data-task='cmd-00001']")
    lane.locator("[data-testid=last-line]").get_by_text("waiting for g1").wait_for(timeout=WAIT_MS)
    (tmp_path / "gates" / "g1").touch()
    t0 = time.monotonic()
    # the slot that ran cmd-00001 takes cmd-00003; the counts say one is done
    page.wait_for_selector(".lane[data-task='cmd-00003']", timeout=WAIT_MS)
    page.wait_for_function(
        "document.querySelector(\"#run-head [data-count='done'] b\").textContent === '1'",
        timeout=WAIT_MS,
    )
    # the header's counts and the table's tabs are one snapshot: equal at the same moment
    head, tab = page.evaluate(TAB_AND_HEAD)
    assert (head, tab) == ("1", "done 1"), (head, tab)
    seen = time.monotonic() - t0
    print(f"lane and counts updated {seen:.2f}s after the gate")  # reported, not asserted
    page.wait_for_selector(".lane rect[data-outcome='done']", timeout=WAIT_MS)
    page.wait_for_selector(
        "[data-testid=task-table] tr[data-task='cmd-00001'] [data-state=done]", timeout=WAIT_MS
    )
    screenshot(page, "run", tmp_path / "shots")
    (tmp_path / "gates" / "g2").touch()  # its slot has nothing left to take: idle
    idle = page.locator(".lane.idle").get_by_text("1 attempt ended here", exact=True)
    idle.wait_for(timeout=WAIT_MS)  # counted, not "1 attempt(s)" (issue 33)
    (tmp_path / "gates" / "g3").touch()
    assert runner.wait(60).returncode == 0
    page.wait_for_function(
        "document.querySelector(\"#run-head [data-count='done'] b\").textContent === '3'",
        timeout=WAIT_MS,
    )
    page.wait_for_selector("#run-head [data-state=complete]", timeout=WAIT_MS)
    assert RunReader(run).counts()["done"] == 3


def test_cancel_button_ends_the_running_task_cancelled(
    tmp_path: Path,
    gpuswarm_popen: Popen,
    page: Any,
    dashboard: Callable[..., Served],
) -> None:
    tasks = gated_commands(tmp_path, "never")
    runner = gpuswarm_popen("run", tasks, "--shell", "--gpus", "sim:1", "--workspace", "runs", "-q")
    run = RunPaths(wait_for_run(tmp_path / "runs"))
    served = dashboard(tmp_path / "runs")
    open_run(page, served)
    page.wait_for_selector(
        ".lane[data-task='cmd-00001'] [data-action=cancel-lane]", timeout=WAIT_MS
    )
    asked: list[str] = []

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)  # a cancel asks first (issue 33): dismissed, nothing is sent
    page.click(".lane[data-task='cmd-00001'] [data-action=cancel-lane]")
    wait_for(lambda: asked, 10, 0.05, "the confirmation")
    assert "cmd-00001" in asked[0], asked
    page.wait_for_timeout(1000)  # time for a request that should not have been made
    assert not [e for e in read_events(run.root) if e.get("ev") == "control"]
    assert RunReader(run).counts()["running"] == 1
    page.once("dialog", lambda d: d.accept())
    page.click(".lane[data-task='cmd-00001'] [data-action=cancel-lane]")
    wait_for(lambda: RunReader(run).counts().get("cancelled") == 1, 30, 0.1, "cancelled")
    assert RunReader(run).counts()["running"] == 0
    page.wait_for_selector(
        "[data-testid=task-table] tr[data-task='cmd-00001'] [data-state=cancelled]",
        timeout=WAIT_MS,
    )
    page.wait_for_selector(".lane rect[data-outcome='cancelled']", timeout=WAIT_MS)
    assert runner.wait(60).returncode == 0  # a cancelled task is no failure


def test_research_result_appears_on_the_chart_and_in_the_table(
    tmp_path: Path,
    gpuswarm: Cli,
    research_repo: Path,
    page: Any,
    dashboard: Callable[..., Served],
) -> None:
    repo = research_repo
    init = gpuswarm(
        "research", "init", "-C", repo, "--tag", "t", "--edit", "train.py",
        "--command", f"{shlex.quote(PY)} train.py", "--gpus", "sim:2",
        "--timeout", "20s", "--linger", "2s",
    )  # fmt: skip
    assert init.returncode == 0, init
    served = dashboard(repo)
    eid = wait_for(lambda: (x := served.get("/api/runs")["experiments"]) and x[0]["id"], 20, 0.1)
    page.goto(served.url)
    page.wait_for_selector(f"[data-exp='{eid}'] a", timeout=WAIT_MS)
    page.click(f"[data-exp='{eid}'] a")
    page.wait_for_selector("[data-testid=chart] svg[data-points='0']", timeout=WAIT_MS)
    assert gpuswarm("research", "baseline", "-C", repo).returncode == 0
    assert gpuswarm("research", "wait", "-C", repo, timeout=60).returncode == 0
    page.wait_for_selector("[data-testid=chart] svg[data-points='1']", timeout=WAIT_MS)
    page.wait_for_selector("[data-testid=exp-rows] tr[data-variant='v0001']", timeout=WAIT_MS)
    edit_constant(repo, "LR", "0.05")
    tried = gpuswarm("research", "try", "-C", repo, "-m", "lr 0.05 <b>bold</b>")
    assert tried.returncode == 0, tried
    assert gpuswarm("research", "wait", "-C", repo, timeout=60).returncode == 0
    page.wait_for_selector("[data-testid=chart] svg[data-points='2']", timeout=WAIT_MS)
    row = page.locator("[data-testid=exp-rows] tr[data-variant='v0002']")
    row.wait_for(timeout=WAIT_MS)
    assert "lr 0.05 <b>bold</b>" in row.inner_text()  # a description is text, never HTML
    assert page.locator("[data-testid=chart] circle[data-variant='v0002']").count() == 1
    assert page.locator("[data-stat=best] b").inner_text() != "—"
    page.set_viewport_size({"width": 1280, "height": 480})  # the diff's place is below it
    row.click()
    diff = page.locator("[data-testid=diff]")
    diff.get_by_text("+LR = 0.05").wait_for(timeout=WAIT_MS)
    # the clicked row's diff is scrolled into sight, below the table as it is (issue 33)
    top = diff.evaluate("e => e.getBoundingClientRect().top")
    assert 0 <= top < page.evaluate("innerHeight") - 40, top
    # the snapshot carries progress.png's running best (plot.running_best over plot_rows)
    view = served.get(f"/api/experiments/{eid}")["view"]
    root = Path(view["path"])
    xs, ys = running_best(plot_rows(replay(ExpPaths(repo=repo, root=root))), view["goal"])
    assert view["best_steps"] == [[x, y] for x, y in zip(xs, ys, strict=True)], view
    assert len(view["best_steps"]) == 2, view["best_steps"]  # BASE, then the kept change
    # the running best is drawn in steps, as progress.png (horizontal, then vertical)
    best = page.locator("[data-testid=chart] path.best").get_attribute("d") or ""
    assert re.fullmatch(r"M[-\d.]+,[-\d.]+(?:[HV][-\d.]+)+", best), best
    # a kept change is labelled, BASE's own run (v0001) is not; no two labels overlap
    labels = page.locator("[data-testid=chart] text.label")
    assert [t.get_attribute("data-variant") for t in labels.all()] == ["v0002"]
    assert not page.evaluate(OVERLAPS)
    drawn, overlap = page.evaluate(CROWDED)  # a run of keeps: some labelled, none overlapping
    assert drawn >= 2 and not overlap, (drawn, overlap)
    # y ticks are round: one step of 1, 2, 2.5 or 5 times a power of ten
    ticks = [float(t) for t in (chart_ticks(page) or "").split()]
    assert len(ticks) >= 3, ticks
    steps = {round(b - a, 12) for a, b in itertools.pairwise(ticks)}
    assert len(steps) == 1, ticks
    mantissa = f"{next(iter(steps)):.3e}".split("e")[0]
    assert mantissa in ("1.000", "2.000", "2.500", "5.000"), ticks
    screenshot(page, "experiment", tmp_path / "shots")


def test_403_without_the_token_and_for_a_foreign_host(
    tmp_path: Path,
    gpuswarm: Cli,
    page: Any,
    dashboard: Callable[..., Served],
) -> None:
    (tmp_path / "tasks.txt").write_text("echo hi\n")
    assert (
        gpuswarm("run", "tasks.txt", "--gpus", "sim:1", "--workspace", "runs", "-q").returncode == 0
    )
    served = dashboard(tmp_path / "runs")
    bare = page.goto(served.base + "/")  # the public page, but no session: nothing of a run
    assert bare is not None and bare.status == 200
    page.evaluate("localStorage.clear()")
    page.reload()
    page.wait_for_selector("[data-testid=no-session]", timeout=WAIT_MS)
    wrong = page.goto(served.base + "/?token=not-it")
    assert wrong is not None and wrong.status == 403
    rebind = page.goto(served.url.replace("127.0.0.1", REBIND_HOST))  # a name that points here
    assert rebind is not None and rebind.status == 403
    assert "not allowed" in page.content()
    ok = page.goto(served.url)
    assert ok is not None and ok.status == 200
    page.wait_for_selector("[data-testid=runs-table]", timeout=WAIT_MS)
    assert page.url == served.base + "/"  # the token and the session left the address bar
    page.goto(served.base + "/#/")  # later visits: the session is this origin's
    page.wait_for_selector("[data-testid=runs-table]", timeout=WAIT_MS)


class _Listener(BaseHTTPRequestHandler):
    """Another server on 127.0.0.1 (a notebook, a dev server): keeps what browsers send it."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers.items()))
        body = b"<!doctype html><title>another server</title><p>hello</p>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_another_local_server_gets_nothing_that_pauses_cancels_or_adds(
    tmp_path: Path,
    gpuswarm_popen: Popen,
    page: Any,
    dashboard: Callable[..., Served],
) -> None:
    """The browser opened the dashboard's URL, then a page of another server on 127.0.0.1
    (cookies ignore ports): whatever it received, replayed to the dashboard with a forged
    Origin, reads nothing and changes nothing."""
    tasks = gated_commands(tmp_path, "gate", "gate")
    runner = gpuswarm_popen("run", tasks, "--shell", "--gpus", "sim:1", "--workspace", "runs", "-q")
    run = RunPaths(wait_for_run(tmp_path / "runs"))
    served = dashboard(tmp_path / "runs")
    page.goto(served.url)
    page.wait_for_selector("[data-testid=runs-table] [data-run]", timeout=WAIT_MS)
    rid = page.get_attribute("[data-testid=runs-table] [data-run]", "data-run")
    assert "token" not in page.url and "session" not in page.url
    page.go_back()  # the token URL is no entry of the history: before the page, the blank one
    assert page.url == "about:blank"
    page.go_forward()
    assert page.url == served.base + "/"
    other = ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    _Listener.seen = []
    try:
        page.goto(f"http://127.0.0.1:{other.server_address[1]}/")
        page.wait_for_selector("text=hello", timeout=WAIT_MS)
        assert page.evaluate("localStorage.getItem('gpuswarm-session')") is None
    finally:
        other.shutdown()
        other.server_close()
    assert _Listener.seen  # the page (and its icon): every header the browser sent there
    assert served.token not in str(_Listener.seen)
    cookie = "; ".join({h["Cookie"] for h in _Listener.seen if h.get("Cookie")})
    secrets = [c.partition("=")[2] for c in cookie.split("; ") if c] or [""]
    refused = []
    with httpx.Client(base_url=served.base, timeout=10) as c:
        for secret in secrets:
            forged = {
                "Cookie": cookie,
                "Origin": served.base,
                "X-Gpuswarm-Token": secret,
                "X-Gpuswarm-Session": secret,
            }
            for action, body in (
                ("pause", {}),
                ("cancel", {"tasks": ["cmd-00001", "cmd-00002"]}),
                ("add", {"commands": f"touch {tmp_path / 'added'}\n"}),
            ):
                path = f"/api/runs/{rid}/actions/{action}?session={secret}"
                refused.append(c.post(path, json=body, headers=forged).status_code)
            refused.append(c.get("/api/runs", headers=forged).status_code)
    assert set(refused) == {403}, refused
    counts = RunReader(run).counts()
    assert not control.paused(run).run and counts.get("cancelled", 0) == 0
    assert counts.get("running") == 1 and counts.get("pending") == 1  # nothing added
    (tmp_path / "gates" / "gate").touch()
    assert runner.wait(60).returncode == 0
    assert not (tmp_path / "added").exists()


def test_the_add_box_runs_lines_through_a_shell_by_default(
    tmp_path: Path, gpuswarm_popen: Popen, page: Any, dashboard: Callable[..., Served]
) -> None:
    """Issue 28: the "Add tasks" box's lines run with /bin/sh -c unless its box is unticked,
    as a command list on the command line does. (A live run's: an ended one offers no Add, it
    says how to add and resume, issue 33.)"""
    tasks = gated_commands(tmp_path, "go")
    runner = gpuswarm_popen("run", tasks, "--shell", "--gpus", "sim:1", "--workspace", "runs", "-q")
    run_dir = wait_for_run(tmp_path / "runs")
    served = dashboard(tmp_path / "runs")
    open_run(page, served)
    page.get_by_role("button", name="Add tasks…").click()
    shell = page.locator("#add-box input[name=shell]")
    assert shell.is_checked()  # the default: /bin/sh -c
    page.fill("#add-box textarea", "echo hello | tr a-z A-Z > {workspace}/out.txt")
    page.get_by_role("button", name="Add to the queue").click()
    # the action's note (the journal's `added` line may show the same words in the feed)
    page.get_by_text("added 1 task").first.wait_for(timeout=WAIT_MS)
    (tmp_path / "gates" / "go").touch()
    assert runner.wait(60).returncode == 0
    (out,) = run_dir.glob("tasks/*/out.txt")  # the added task's folder (named by its id)
    assert out.read_text() == "HELLO\n"


def test_a_task_named_script_shows_as_text(
    tmp_path: Path, gpuswarm: Cli, page: Any, dashboard: Callable[..., Served]
) -> None:
    hostile = "echo '<script>window.__pwned=1</script><img src=x onerror=window.__pwned=2>'"
    (tmp_path / "tasks.txt").write_text(hostile + "\n")
    res = gpuswarm("run", "tasks.txt", "--shell", "--gpus", "sim:1", "--workspace", "runs", "-q")
    assert res.returncode == 0, res
    served = dashboard(tmp_path / "runs")
    open_run(page, served)
    cell = page.locator("[data-testid=task-table] tr[data-task='cmd-00001'] td").nth(1)
    cell.wait_for(timeout=WAIT_MS)
    assert "<script>window.__pwned=1</script>" in cell.inner_text()
    page.click("[data-testid=task-table] tr[data-task='cmd-00001'] a")
    log = page.locator("[data-testid=log]")
    log.get_by_text("the task ended: done").wait_for(timeout=WAIT_MS)
    assert "<img src=x onerror=window.__pwned=2>" in log.inner_text()
    assert page.locator("img").count() == 0 and page.locator("main script").count() == 0
    assert page.evaluate("window.__pwned") is None
    screenshot(page, "task", tmp_path / "shots")


def test_the_run_page_shows_each_groups_progress(
    tmp_path: Path, page: Any, dashboard: Callable[..., Served]
) -> None:
    """Issue 35: a run's groups with their progress (status --group's table) on its page."""
    from gpuswarm.app import api
    from gpuswarm.app.control import add_tasks, cancel_tasks
    from gpuswarm.config.load import load_config

    ws = tmp_path / "runs"
    ws.mkdir()
    spec = api.NewRunSpec(workspace=ws, folder="g", name="g", base_dir=ws,
                          gpus=api.plan_gpus("sim:2"), source="test")  # fmt: skip
    run = api.create_run(spec)
    config = tmp_path / "more.yaml"
    tasks = [{"name": f"t{i}", "command": "true", "group": "sweep"} for i in range(4)]
    config.write_text(json_text({"name": "g", "tasks": tasks}))
    add_tasks(run.root, load_config(config))
    cancel_tasks(run.root, ["t0"], reason="test", wait=None)
    served = dashboard(ws)
    rid = wait_for(lambda: (r := served.get("/api/runs")["runs"]) and r[0]["id"], 20, 0.1)
    page.goto(served.url)
    page.wait_for_selector(f"[data-run='{rid}'] a", timeout=WAIT_MS)
    page.click(f"[data-run='{rid}'] a")
    row = page.wait_for_selector("[data-testid=groups] [data-group=sweep]", timeout=WAIT_MS)
    assert "1/4" in row.inner_text() and "25.0%" in row.inner_text()
    screenshot(page, "groups", tmp_path / "shots")


def json_text(obj: Any) -> str:
    import json

    return json.dumps(obj)
