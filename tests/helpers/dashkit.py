"""Driving the dashboard in tests: a server in this process (a thread running uvicorn on a free
port), the real ``gpuswarm dashboard`` CLI in a subprocess, SSE reading, and the browser
(Debian's chromium through Playwright) with its screenshots.

A test that needs the browser is skipped when chromium or Playwright is missing, and fails
instead when ``CI=true`` or ``GPUSWARM_REQUIRE_BROWSER=1`` (``.ci/run`` installs chromium: a
missing one must not pass by skipping).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from cli_driver import CliProcess, start_cli, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REBIND_HOST = "rebind.example"  # resolves to 127.0.0.1 in the test browser: a DNS rebinding


def exchange(base: str, token: str) -> str:
    """The session the login redirect gives for the URL's token (as the page takes it from
    the fragment of ``Location: /#session=...``)."""
    r = httpx.get(f"{base}/", params={"token": token}, follow_redirects=False, timeout=10)
    assert r.status_code == 303, r.text
    found = re.fullmatch(r"/#session=([A-Za-z0-9_-]+)", r.headers["location"])
    assert found, r.headers["location"]
    return found.group(1)


@dataclass
class Served:
    """A dashboard being served: its URL with the token, and HTTP clients that send the
    session (as the page does after opening the URL)."""

    url: str
    token: str
    port: int
    stop: Any = None
    process: CliProcess | None = None
    clients: list[httpx.Client] = field(default_factory=list)
    _session: str = ""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def session(self) -> str:
        if not self._session:
            self._session = exchange(self.base, self.token)
        return self._session

    def client(self, *, session: bool = True, timeout: float = 10.0) -> httpx.Client:
        headers = {"X-Gpuswarm-Session": self.session} if session else None
        c = httpx.Client(base_url=self.base, headers=headers, timeout=timeout)
        self.clients.append(c)
        return c

    def post(self, path: str, body: dict[str, Any], **headers: str) -> httpx.Response:
        sent = {"X-Gpuswarm-Session": self.session, "Origin": self.base, **headers}
        c = self.client(session=False)
        return c.post(path, json=body, headers={k: v for k, v in sent.items() if v})

    def get(self, path: str) -> Any:
        r = self.client().get(path)
        assert r.status_code == 200, r.text
        return r.json()

    def close(self) -> None:
        for c in self.clients:
            c.close()


def parse_url(url: str) -> tuple[int, str]:
    parts = urlsplit(url)
    token = re.search(r"token=([^&]+)", parts.query)
    assert parts.port and token, url
    return parts.port, token.group(1)


@contextlib.contextmanager
def serve_here(paths: list[Path], *, read_only: bool = False) -> Iterator[Served]:
    """The dashboard of ``paths`` served by uvicorn in a thread of this process."""
    import uvicorn

    from gpuswarm.dashboard.catalog import classify
    from gpuswarm.dashboard.server import Settings, build_app
    from gpuswarm.dashboard.serving import SHUTDOWN_SECONDS, bind_socket

    sock = bind_socket("127.0.0.1", 0)
    settings = Settings(roots=[classify(p) for p in paths], read_only=read_only)
    settings.port = int(sock.getsockname()[1])
    app, dash, guard = build_app(settings)
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
        ws="none",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, what="uvicorn started")
    served = Served(guard.url("127.0.0.1"), guard.token, settings.port)
    try:
        yield served
    finally:
        served.close()
        if dash.loop is not None:
            dash.loop.call_soon_threadsafe(dash.stop_streams)
        server.should_exit = True
        thread.join(10)
        sock.close()


def start_dashboard(*args: str | os.PathLike[str], cwd: Path, log_dir: Path) -> Served:
    """The real CLI, ``gpuswarm dashboard ARGS``, once it printed its URL."""
    proc = start_cli("dashboard", *args, cwd=cwd, log_dir=log_dir)

    def url() -> str | None:
        if not proc.alive():
            raise AssertionError(f"dashboard exited: {proc.stderr()}")
        line = proc.stdout().strip()
        return line.splitlines()[0] if line else None

    found = wait_for(url, 20, 0.05, "the dashboard's URL")
    port, token = parse_url(found)
    return Served(found, token, port, process=proc)


_LINES: dict[int, tuple[httpx.Response, Iterator[str]]] = {}  # one line iterator per stream


def sse_messages(
    response: httpx.Response, count: int, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """The next ``count`` SSE messages of a streaming response: {id, event, data}."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    lines = _LINES.get(id(response))
    if lines is None or lines[0] is not response:
        lines = _LINES[id(response)] = (response, response.iter_lines())
    for line in lines[1]:
        if time.monotonic() > deadline:
            break
        if not line:
            if "data" in current:
                current["data"] = json.loads(current["data"])
                out.append(current)
                if len(out) >= count:
                    return out
            current = {}
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(": ")
        current[key] = value
    raise AssertionError(f"got {len(out)} of {count} SSE messages: {out}")


# -- the browser -------------------------------------------------------------------------------
def browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install '.[dev]')"
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    return None


def require_browser() -> None:
    """Skip without a browser; fail under CI=true or GPUSWARM_REQUIRE_BROWSER=1 (.ci/run
    installs one: a missing browser must not pass by skipping)."""
    why = browser_missing()
    if why is None:
        return
    if os.environ.get("CI", "").lower() == "true" or os.environ.get("GPUSWARM_REQUIRE_BROWSER"):
        pytest.fail(f"browser tests need a browser here (CI): {why}")
    pytest.skip(why)


@contextlib.contextmanager
def browser_context(profile: Path) -> Iterator[Any]:
    """One persistent chromium context (the module's browser)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=[*CHROMIUM_FLAGS, f"--host-resolver-rules=MAP {REBIND_HOST} 127.0.0.1"],
            headless=True,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield ctx
        finally:
            ctx.close()


def screenshot(page: Any, name: str, folder: Path) -> Path:
    """A screenshot of the whole page into ``folder`` (a test artifact), copied to
    ``$GPUSWARM_SHOTS_DIR`` when it is set."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    shots = os.environ.get("GPUSWARM_SHOTS_DIR")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(shots) / path.name)
    return path
