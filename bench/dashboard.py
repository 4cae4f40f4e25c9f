"""8. The dashboard (issue 18): first paint of a 100,000-task run and the server's idle cost.

Fixture: ``gpuswarm run -q --no-report --gpus sim:8`` over a 100,000-line ``true`` list (10,000
with --quick), stopped with SIGINT once 2,000 tasks finished: a stopped run of 100k tasks (about
2k done, the rest pending) with a journal of about 6k events.

(a) first paint: ``gpuswarm dashboard RUN`` (the real CLI) is started; chromium (Playwright,
    ``/usr/bin/chromium``) opens the run's page (the token URL, then ``#/run/<id>``) in a fresh
    page (that has shown ``about:blank``: the browser's own start is not counted); the clock runs
    from ``page.goto`` until the lanes and the first rows of the task table are in the DOM
    (and, on rows of their own, until the lanes and counts alone are).
    Cold: the first page of a dashboard started just before (its task index of the 100k names
    is being built then); warm: the median of 5 reloads. Beside it, the terminal's view of the
    same run: ``gpuswarm status RUN --json`` (median of 3).
(b) the task table's API, warm: page 1 in queue order, a page in the middle sorted by id
    descending, and the ``done`` filter (``GET /api/runs/<id>/tasks``, median of 20 each).
(c) idle cost: the dashboard process's CPU time (user + system, psutil) over 30 s (10 s with
    --quick) while one page follows the run's stream, as a share of one core; on the stopped
    100k run, and on a live idle run (``gpuswarm run --gpus sim:2`` of two ``sleep 1000``
    tasks: nothing happens). Beside it, the terminal's live view, ``gpuswarm watch RUN``, over
    the same live idle run and window. Target: under 1% of a core.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from common import (
    GPUSWARM,
    Config,
    EventTail,
    Row,
    env_for_bench,
    failed,
    median,
    say,
    skipped,
    stop_tree,
    the_run,
    wait_for,
)

BENCH = "8 dashboard"
BEGIN = "<!-- bench:dashboard:begin (written by bench/run.py; do not edit by hand) -->"
END = "<!-- bench:dashboard:end -->"
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _launch(argv: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env_for_bench(),
            cwd=cwd,
            start_new_session=True,
        )


def _big_run(work: Path, n: int, finished: int) -> Path:
    cmds, ws = work / "cmds.txt", work / "ws"
    cmds.write_text("true\n" * n)
    argv = [*GPUSWARM, "run", "-q", "--no-report", "--gpus", "sim:8", "--workspace", str(ws)]
    proc = _launch([*argv, str(cmds)], work / "run.log")
    try:
        if not wait_for(lambda: the_run(ws) is not None or proc.poll() is not None, 300):
            raise RuntimeError("no run folder after 300 s")
        run_dir = the_run(ws)
        if run_dir is None:
            raise RuntimeError(f"gpuswarm exited {proc.returncode} without a run folder")
        tail = EventTail(run_dir / "events.jsonl", from_end=False)
        done = 0
        deadline = time.monotonic() + 600
        while done < finished and proc.poll() is None and time.monotonic() < deadline:
            done += sum(1 for ev in tail.poll() if ev.get("ev") == "finished")
            time.sleep(0.05)
        stop_tree(proc, signal.SIGINT, wait=600)
    finally:
        stop_tree(proc, signal.SIGKILL, wait=10)
    return run_dir


@contextlib.contextmanager
def _dashboard(
    work: Path, target: Path, name: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    log = work / f"{name}.log"
    proc = _launch([*GPUSWARM, "dashboard", str(target)], log)
    try:
        found: list[str] = []

        def url() -> bool:
            m = re.search(r"http://\S+token=\S+", log.read_text(errors="replace"))
            if m:
                found.append(m.group(0))
            return bool(m) or proc.poll() is not None

        wait_for(url, 60, 0.02)
        if not found:
            raise RuntimeError(f"the dashboard printed no URL: {log.read_text()[-400:]}")
        yield proc, found[0]
    finally:
        stop_tree(proc, signal.SIGINT, wait=20)
        stop_tree(proc, signal.SIGKILL, wait=5)


def _client(url: str) -> Any:
    import httpx

    m = re.match(r"http://([^/]+):(\d+)/\?token=(\S+)", url)
    assert m, url
    port, token = m.group(2), m.group(3)
    base = f"http://127.0.0.1:{port}"
    login = httpx.get(f"{base}/", params={"token": token}, follow_redirects=False)
    session = login.headers["location"].partition("#session=")[2]  # as the page takes it
    return httpx.Client(base_url=base, headers={"X-Gpuswarm-Session": session})


def _run_id(client: Any) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = client.get("/api/runs").json()["runs"]
        if runs:
            return str(runs[0]["id"])
        time.sleep(0.1)
    raise RuntimeError("the dashboard lists no run")


def _paint(page: Any, url: str) -> float:
    return _paints(page, url)[1]


def _paints(page: Any, url: str) -> tuple[float, float]:
    """Seconds from ``goto`` until the lanes and counts are drawn, and until the task table's
    first rows are too."""
    t0 = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("[data-slot], .lanes .muted", timeout=60_000)
    page.wait_for_selector("#run-head [data-count]", timeout=60_000)
    lanes = time.perf_counter() - t0
    page.wait_for_selector("[data-testid=task-table] tbody tr", timeout=60_000)
    return lanes, time.perf_counter() - t0


def _cpu_share(proc_pid: int, seconds: float) -> float:
    p = psutil.Process(proc_pid)
    before = p.cpu_times()
    t0 = time.monotonic()
    time.sleep(seconds)
    after = p.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (time.monotonic() - t0)


def _status_wall(run_dir: Path) -> float:
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(
            [*GPUSWARM, "status", str(run_dir), "--json"],
            env=env_for_bench(),
            capture_output=True,
            check=False,
        )
        walls.append(time.perf_counter() - t0)
    return median(walls)


def run(cfg: Config) -> list[Row]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return [skipped(BENCH, "first paint", "gpuswarm dashboard", "playwright not installed")]
    if not Path(CHROMIUM).exists():
        return [skipped(BENCH, "first paint", "gpuswarm dashboard", f"{CHROMIUM} missing")]
    n = 10_000 if cfg.quick else 100_000
    window = 10.0 if cfg.quick else 30.0
    work = cfg.work / "dashboard"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    say(f"dashboard: a {n:,}-task run, stopped after 2,000 finished")
    big = _big_run(work, n, 2000)
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(work / "profile"), executable_path=CHROMIUM, args=FLAGS, headless=True
        )
        try:
            rows += _first_paint(ctx, work, big, n)
            rows += _idle(ctx, work, big, n, window)
        except Exception as exc:
            rows.append(failed(BENCH, "dashboard", "gpuswarm dashboard", exc))
        finally:
            ctx.close()
    return rows


def _first_paint(ctx: Any, work: Path, big: Path, n: int) -> list[Row]:
    size = f"{n // 1000}k tasks"
    with _dashboard(work, big, "dash-paint") as (_, url):
        client = _client(url)
        rid = _run_id(client)
        page = ctx.new_page()
        page.goto("about:blank")  # the browser's own start (a renderer process) is not ours
        target = url + f"#/run/{rid}"
        cold_lanes, cold = _paints(page, target)
        warm_both = [_paints(page, target) for _ in range(5)]
        warm = median([w for _, w in warm_both])
        warm_lanes = median([w for w, _ in warm_both])
        page.close()
        api: dict[str, float] = {}
        for label, query in (
            ("page 1, queue order", "limit=50"),
            ("a middle page by id desc", f"sort=id&dir=desc&offset={n // 2}&limit=50"),
            ("state filter done", "state=done&limit=50"),
        ):
            walls = []
            for _ in range(20):
                t0 = time.perf_counter()
                r = client.get(f"/api/runs/{rid}/tasks?{query}")
                walls.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            api[label] = median(walls)
        client.close()
    status = _status_wall(big)
    out = [
        Row(BENCH, f"first paint with the table, cold ({size})", "gpuswarm dashboard", cold, "s",
            "< 1 s", cold < 1.0, f"{cold / status:.2f}x gpuswarm status"),
        Row(BENCH, f"first paint with the table, warm ({size})", "gpuswarm dashboard", warm, "s",
            "< 1 s", warm < 1.0, f"{warm / status:.2f}x gpuswarm status"),
        Row(BENCH, f"lanes and counts drawn, cold ({size})", "gpuswarm dashboard", cold_lanes,
            "s", "< 1 s", cold_lanes < 1.0, f"{cold_lanes / status:.2f}x gpuswarm status"),
        Row(BENCH, f"lanes and counts drawn, warm ({size})", "gpuswarm dashboard", warm_lanes,
            "s", "< 1 s", warm_lanes < 1.0, f"{warm_lanes / status:.2f}x gpuswarm status"),
        Row(BENCH, f"the same run in the terminal ({size})", "gpuswarm status --json", status, "s"),
    ]  # fmt: skip
    for label, wall in api.items():
        out.append(Row(BENCH, f"task table API: {label} ({size})", "gpuswarm dashboard",
                       wall * 1000, "ms"))  # fmt: skip
    return out


def _idle_run(work: Path) -> tuple[subprocess.Popen[bytes], Path]:
    cmds, ws = work / "idle.txt", work / "idle-ws"
    cmds.write_text("sleep 1000\nsleep 1000\n")
    argv = [*GPUSWARM, "run", "-q", "--no-report", "--gpus", "sim:2", "--workspace", str(ws)]
    proc = _launch([*argv, str(cmds)], work / "idle-run.log")
    if not wait_for(lambda: the_run(ws) is not None, 60):
        raise RuntimeError("no idle run")
    run_dir = the_run(ws)
    assert run_dir is not None
    events = run_dir / "events.jsonl"
    wait_for(lambda: events.exists() and events.read_text().count('"started"') >= 2, 60)
    return proc, run_dir


def _idle(ctx: Any, work: Path, big: Path, n: int, window: float) -> list[Row]:
    rows: list[Row] = []
    target = f"{window:.0f} s, one page open"
    with _dashboard(work, big, "dash-idle-big") as (proc, url):
        rid = _run_id(_client(url))
        page = ctx.new_page()
        _paint(page, url + f"#/run/{rid}")
        share = _cpu_share(proc.pid, window)
        page.close()
    rows.append(Row(BENCH, f"idle CPU, stopped {n // 1000}k-task run ({target})",
                    "gpuswarm dashboard", share, "% of a core", "< 1%", share < 1.0))  # fmt: skip
    live, run_dir = _idle_run(work)
    try:
        with _dashboard(work, run_dir, "dash-idle-live") as (proc, url):
            rid = _run_id(_client(url))
            page = ctx.new_page()
            _paint(page, url + f"#/run/{rid}")
            share = _cpu_share(proc.pid, window)
            page.close()
        watch = _launch([*GPUSWARM, "watch", str(run_dir), "--plain"], work / "watch.log")
        try:
            time.sleep(2)  # its start-up is not idling
            watch_share = _cpu_share(watch.pid, window)
        finally:
            stop_tree(watch, signal.SIGINT, wait=10)
            stop_tree(watch, signal.SIGKILL, wait=5)
    finally:
        stop_tree(live, signal.SIGINT, wait=60)
        stop_tree(live, signal.SIGKILL, wait=10)
    ratio = f"{share / watch_share:.2f}x watch" if watch_share > 0 else ""
    rows.append(Row(BENCH, f"idle CPU, live idle run, 2 slots ({target})", "gpuswarm dashboard",
                    share, "% of a core", "< 1%", share < 1.0, ratio))  # fmt: skip
    rows.append(Row(BENCH, f"idle CPU, live idle run, 2 slots ({window:.0f} s)",
                    "gpuswarm watch --plain", watch_share, "% of a core"))  # fmt: skip
    return rows
