"""Serving the dashboard: its listening socket bound before the app (the printed URL names the
port really bound), then uvicorn with a bounded graceful shutdown: open SSE streams are ended
first, ``timeout_graceful_shutdown`` bounds what is left, so Ctrl-C exits within a second or two.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any, TextIO

from gpuswarm.core.errors import BadInputError
from gpuswarm.dashboard.server import Settings, build_app

SHUTDOWN_SECONDS = 2


def bind_socket(address: str, port: int) -> socket.socket:
    """A listening socket on ``address:port`` (port 0: a free one), made before the app so
    that the printed URL names the port really bound."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: an answer's headers and body go out at once (with
    # Nagle's algorithm, the body waited for the client's delayed ACK: 40 ms per request)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise BadInputError(
            f"--port {port}: cannot listen on {address}:{port} ({exc.strerror}); pick another "
            "port, or leave --port out for a free one"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    settings: Settings, *, stream: TextIO, on_url: Callable[[str], None] | None = None
) -> int:
    """Serve until Ctrl-C / SIGTERM; prints the URL (with its token) on ``stream``."""
    import uvicorn

    sock = bind_socket(settings.bind, settings.port)
    port = int(sock.getsockname()[1])
    settings.port = port
    app, dash, guard = build_app(settings)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
        lifespan="on",
        ws="none",
        server_header=False,
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if dash.loop is not None:  # streams end: the graceful shutdown can finish
                dash.loop.call_soon_threadsafe(dash.stop_streams)
            super().handle_exit(sig, frame)

    server = Server(config)
    host = "127.0.0.1" if settings.bind in ("0.0.0.0", "::") else settings.bind
    url = guard.url(host)
    stream.write(f"{url}\n")
    stream.flush()
    if on_url is not None:
        on_url(url)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
