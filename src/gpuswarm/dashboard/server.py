"""The dashboard's web server: a Starlette app (JSON, Server-Sent Events, the one page and its
script and style), behind :class:`~gpuswarm.dashboard.security.GuardMiddleware`; served by
``dashboard/serving.py`` (uvicorn, 127.0.0.1 unless told otherwise).

One poller task (every ``POLL_SECONDS``, in a worker thread) looks at every hub: a stat of each
journal and ledger, a liveness check a second, the catalog's folders every two seconds; streams
of what changed are woken (``sse.Signal``). Blocking reads (snapshots, task pages, actions) run
in threads, never on the event loop.

Stopping: an SSE stream never ends by itself; :meth:`Dashboard.stop_streams` ends every one
(``Signal.stop``) before uvicorn's graceful shutdown waits for open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gpuswarm.core.errors import BadInputError, GpuswarmError
from gpuswarm.dashboard import sse
from gpuswarm.dashboard.actions import ACTIONS, call
from gpuswarm.dashboard.catalog import RESCAN_SECONDS, Catalog, Root, RunsPage
from gpuswarm.dashboard.experiments import ExperimentHub
from gpuswarm.dashboard.metricspage import MetricsPage
from gpuswarm.dashboard.responses import (
    NotFoundError,
    bad_input,
    error_response,
    event_stream,
    json_response,
    not_found,
    query_number,
)
from gpuswarm.dashboard.security import Guard, GuardMiddleware, new_token
from gpuswarm.dashboard.taskview import (
    LogPump,
    NoSuchTaskError,
    log_stream,
    parse_resume,
    task_detail,
)

POLL_SECONDS = 0.2
LINES_SECONDS = 1.0  # how often running lanes' last output lines are looked at (pages open)
STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


@dataclass
class Settings:
    roots: Sequence[Root]
    read_only: bool = False
    port: int = 0
    bind: str = "127.0.0.1"
    allow_hosts: Sequence[str] = ()
    token: str = ""


def _asset(name: str) -> bytes:
    return resources.files("gpuswarm.dashboard").joinpath("static").joinpath(name).read_bytes()


class Dashboard:
    """The app's state: the catalog, the wake-ups, the settings; and the routes."""

    def __init__(self, settings: Settings, guard: Guard) -> None:
        self.settings = settings
        self.guard = guard
        self.catalog = Catalog(settings.roots)
        self.signal: sse.Signal | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ready = asyncio.Event()
        self._scanned = 0.0
        self._lines_at = 0.0
        self._complaints: dict[str, str] = {}
        self._metrics = MetricsPage([r.path for r in settings.roots])
        self.page = _asset("index.html")
        self.assets = {name: _asset(name) for name in STATIC}

    # -- the poller ----------------------------------------------------------------------------
    def tick(self) -> set[str]:
        """One look at everything (a worker thread): the keys whose streams must wake."""
        fired: set[str] = set()
        now = time.monotonic()
        if now - self._scanned >= RESCAN_SECONDS:
            self._scanned = now
            if self.catalog.scan():
                fired.add("*")
        runs, exps = self.catalog.hubs()
        lines = now - self._lines_at >= LINES_SECONDS
        if lines:
            self._lines_at = now
        for hub in runs:
            try:
                changed = hub.poll() or bool(
                    lines and hub.watchers and hub.live and hub.lines_changed()
                )
            except OSError as exc:  # one unreadable run must not stall the others
                self._complain(hub.id, exc)
                continue
            if changed:
                fired.update((hub.id, "*"))
                if hub.experiment:
                    fired.add(hub.experiment)
        for exp in exps:
            try:
                if exp.poll():
                    fired.update((exp.id, "*"))
            except (OSError, ValueError) as exc:
                self._complain(exp.id, exc)
        return fired

    def _complain(self, key: str, exc: BaseException) -> None:
        """Say once per run what keeps it from being followed (it is retried every tick)."""
        text = f"{key}: {exc}"
        if self._complaints.get(key) != text:
            self._complaints[key] = text
            print(f"gpuswarm dashboard: {text}", file=sys.stderr)

    async def poller(self) -> None:
        assert self.signal is not None
        signal = self.signal
        await asyncio.to_thread(self.tick)
        self.ready.set()
        while not signal.stopping.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(signal.stopping.wait(), POLL_SECONDS)
            if signal.stopping.is_set():
                return
            try:
                fired = await asyncio.to_thread(self.tick)
            except Exception as exc:  # a folder removed under us: keep serving the rest
                print(f"gpuswarm dashboard: {exc!r}", file=sys.stderr)
                continue
            for key in fired:
                signal.fire(key)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.signal = sse.Signal()
        self.loop = asyncio.get_running_loop()
        task = asyncio.create_task(self.poller())
        try:
            yield
        finally:
            self.signal.stop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stop_streams(self) -> None:
        if self.signal is not None:
            self.signal.stop()

    # -- routes --------------------------------------------------------------------------------
    def routes(self) -> list[Route]:
        return [
            Route("/", self.index),
            Route("/static/{name}", self.static),
            Route("/api/runs", self.runs),
            Route("/api/events/runs", self.runs_events),
            Route("/api/runs/{rid}", self.run),
            Route("/api/runs/{rid}/events", self.run_events),
            Route("/api/runs/{rid}/tasks", self.tasks),
            Route("/api/runs/{rid}/tasks/{tid}", self.task),
            Route("/api/runs/{rid}/tasks/{tid}/log", self.task_log),
            Route("/api/runs/{rid}/actions/{action}", self.action, methods=["POST"]),
            Route("/api/experiments/{eid}", self.experiment),
            Route("/api/experiments/{eid}/events", self.experiment_events),
            Route("/api/experiments/{eid}/variants/{vid}/diff", self.diff),
            Route("/metrics", self.metrics),  # issue 37: Prometheus (a bearer token: security)
        ]

    async def metrics(self, request: Request) -> Response:
        body, kind = await run_in_threadpool(self._metrics.scrape)
        return Response(body, media_type=kind)

    async def index(self, request: Request) -> Response:
        meta = f'<meta name="gpuswarm-read-only" content="{int(self.settings.read_only)}">'
        # the page is public (it holds nothing of a run): its script brings the session
        body = self.page.replace(b"<!--meta-->", meta.encode())
        return Response(body, media_type="text/html; charset=utf-8")

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.assets:
            return error_response(404, f"no such file: {name}")
        return Response(self.assets[name], media_type=STATIC[name])

    async def _ready(self) -> None:
        await self.ready.wait()

    async def runs(self, request: Request) -> Response:
        await self._ready()
        return json_response(await run_in_threadpool(self._listing))

    def _listing(self) -> RunsPage:
        return {**self.catalog.listing(), "read_only": self.settings.read_only}

    async def runs_events(self, request: Request) -> Response:
        await self._ready()
        assert self.signal is not None
        last = [""]

        def frame() -> bytes | None:
            data = self._listing()
            text = json.dumps(data, sort_keys=True, default=str)
            if text == last[0]:
                return None
            last[0] = text
            return sse.frame("runs", data)

        return event_stream(sse.follow(self.signal, "*", frame, frame))

    def _hub(self, request: Request) -> Any:
        hub = self.catalog.run(request.path_params["rid"])
        if hub is None:
            raise NotFoundError(
                f"no run {request.path_params['rid']!r} here (the runs page lists them)"
            )
        return hub

    async def run(self, request: Request) -> Response:
        await self._ready()
        hub = self._hub(request)
        data = await run_in_threadpool(hub.snapshot)
        return json_response({**data, "read_only": self.settings.read_only})

    async def run_events(self, request: Request) -> Response:
        await self._ready()
        assert self.signal is not None
        hub = self._hub(request)
        pos = [sse.last_event_id(request.headers.get("last-event-id"))]

        def frame() -> bytes | None:
            got = hub.since(pos[0]) if pos[0] is not None else None
            if got is None:
                snap = hub.snapshot()
                pos[0] = snap["pos"]
                return sse.frame("snapshot", {**snap, "read_only": self.settings.read_only}, pos[0])
            end, events = got
            pos[0] = end
            return sse.frame("update", hub.update(events, end), end)

        async def body() -> AsyncIterator[bytes]:
            hub.watchers += 1
            try:
                async for chunk in sse.follow(self.signal, hub.id, frame, frame):  # type: ignore[arg-type]
                    yield chunk
            finally:
                hub.watchers -= 1

        return event_stream(body())

    async def tasks(self, request: Request) -> Response:
        await self._ready()
        hub = self._hub(request)
        q = request.query_params
        state = q.get("state") or None
        data = await run_in_threadpool(
            lambda: hub.tasks.page(
                state=state,
                sort=q.get("sort", "order"),
                descending=q.get("dir") == "desc",
                offset=query_number(q.get("offset"), 0),
                limit=query_number(q.get("limit"), 50),
                query=q.get("q", "")[:200],
            )
        )
        return json_response(data)

    async def task(self, request: Request) -> Response:
        await self._ready()
        hub = self._hub(request)
        data = await run_in_threadpool(
            task_detail, hub.paths, request.path_params["tid"], hub.redactor
        )
        return json_response(
            {**data, "run": hub.id, "run_title": hub.title, "read_only": self.settings.read_only}
        )

    async def task_log(self, request: Request) -> Response:
        await self._ready()
        assert self.signal is not None
        hub = self._hub(request)
        resume = parse_resume(request.headers.get("last-event-id"))
        pump = await run_in_threadpool(
            LogPump, hub.paths, request.path_params["tid"], resume, hub.redactor
        )
        return event_stream(log_stream(pump, self.signal))

    async def action(self, request: Request) -> Response:
        await self._ready()
        if self.settings.read_only:
            return error_response(403, "this dashboard is read-only (started with --read-only)")
        hub = self._hub(request)
        name = request.path_params["action"]
        handler = ACTIONS.get(name)
        if handler is None:
            return error_response(404, f"no action {name!r}; actions: {', '.join(ACTIONS)}")
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the request's body is no JSON")
        if not isinstance(body, dict):
            return error_response(400, "the request's body must be a JSON object")
        try:
            data = await run_in_threadpool(call, handler, hub, body)
        except BadInputError as exc:
            return error_response(400, str(exc))
        except GpuswarmError as exc:
            return error_response(409, str(exc))
        return json_response(data)

    def _exp(self, request: Request) -> ExperimentHub:
        exp = self.catalog.experiment(request.path_params["eid"])
        if exp is None:
            raise NotFoundError(f"no experiment {request.path_params['eid']!r} here")
        return exp

    async def experiment(self, request: Request) -> Response:
        await self._ready()
        exp = self._exp(request)
        run = self.catalog.run(exp.run_id)
        return json_response(await run_in_threadpool(exp.snapshot, run))

    async def experiment_events(self, request: Request) -> Response:
        await self._ready()
        assert self.signal is not None
        exp = self._exp(request)
        last = [""]

        def frame() -> bytes | None:
            data = exp.snapshot(self.catalog.run(exp.run_id))
            text = json.dumps(data, sort_keys=True, default=str)
            if text == last[0]:
                return None
            last[0] = text
            return sse.frame("experiment", data, data["pos"])

        return event_stream(sse.follow(self.signal, exp.id, frame, frame))

    async def diff(self, request: Request) -> Response:
        await self._ready()
        exp = self._exp(request)
        try:
            data = await run_in_threadpool(exp.diff, request.path_params["vid"])
        except BadInputError as exc:
            return error_response(404, str(exc))
        return json_response(data)


def build_app(settings: Settings) -> tuple[Starlette, Dashboard, Guard]:
    """The ASGI app (the guard in front of it), its state and its guard; ``settings.port``
    must be the port it will be served on (the Host allowlist checks it)."""
    guard = Guard(
        token=settings.token or new_token(),
        port=settings.port,
        bind=settings.bind,
        allow_hosts=settings.allow_hosts,
    )
    dash = Dashboard(settings, guard)
    app = Starlette(
        routes=dash.routes(),
        lifespan=dash.lifespan,
        exception_handlers={
            NotFoundError: not_found,
            NoSuchTaskError: not_found,
            BadInputError: bad_input,
        },
    )
    app.add_middleware(GuardMiddleware, guard=guard)
    return app, dash, guard
