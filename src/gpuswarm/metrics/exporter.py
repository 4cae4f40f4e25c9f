"""``gpuswarm exporter``: the metrics alone, on a small threaded HTTP server of the standard
library (no Starlette, no uvicorn: the base install and ``prometheus_client``).

``GET /metrics`` answers the Prometheus text format; ``/`` says where to look. With a token
(``--token-env NAME``: the variable holding it, never the value on the command line) every
request needs ``Authorization: Bearer <token>``; without one it listens on 127.0.0.1 only,
unless told otherwise."""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TextIO

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuswarm.core.errors import BadInputError
from gpuswarm.metrics.collector import SwarmCollector
from gpuswarm.metrics.gpus import HostGpus
from gpuswarm.metrics.sources import Sources


def registry_for(roots: Sequence[Path], *, gpus: HostGpus | None = None) -> CollectorRegistry:
    """A registry of its own (no process metrics of this server) with the gpuswarm series."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SwarmCollector(Sources(roots), gpus))
    return registry


def bearer_ok(header: str | None, token: str) -> bool:
    """``Authorization: Bearer <token>`` compared in constant time."""
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


def _handler(registry: CollectorRegistry, token: str | None) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()  # one scrape at a time: the sources refresh in place

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuswarm-exporter"
        sys_version = ""

        def do_GET(self) -> None:
            if token is not None and not bearer_ok(self.headers.get("Authorization"), token):
                self._send(401, b"needs Authorization: Bearer <token>\n", "text/plain")
                return
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                with lock:
                    body = generate_latest(registry)
                self._send(200, body, CONTENT_TYPE_LATEST)
            elif path == "/":
                self._send(200, b"gpuswarm exporter: scrape /metrics\n", "text/plain")
            else:
                self._send(404, b"no such page: scrape /metrics\n", "text/plain")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # no access log

    return Handler


def make_server(
    registry: CollectorRegistry, *, bind: str, port: int, token: str | None
) -> ThreadingHTTPServer:
    try:
        server = ThreadingHTTPServer((bind, port), _handler(registry, token))
    except OSError as exc:
        raise BadInputError(
            f"--port {port}: cannot listen on {bind}:{port} ({exc.strerror}); pick another "
            "port, or --port 0 for a free one"
        ) from None
    server.daemon_threads = True
    return server


def serve(
    roots: Sequence[Path],
    *,
    bind: str,
    port: int,
    token: str | None,
    stream: TextIO,
    on_ready: Callable[[ThreadingHTTPServer], None] | None = None,
) -> None:
    """Serve until interrupted; prints the scrape URL on ``stream``."""
    gpus = HostGpus()
    server = make_server(registry_for(roots, gpus=gpus), bind=bind, port=port, token=token)
    host, bound = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    stream.write(f"http://{shown}:{bound}/metrics\n")
    stream.flush()
    if on_ready is not None:
        on_ready(server)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        gpus.close()
