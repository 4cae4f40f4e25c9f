"""A real local HTTP receiver for webhook tests (issue 37): it records every POST (headers,
body) and answers 204, after ``hang`` seconds when asked to hang."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, hang: float = 0.0) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.hang = hang
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if outer.hang:
                    time.sleep(outer.hang)
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.got]

    def close(self) -> None:
        """Stop serving and close the listening socket (later connections are refused)."""
        self.server.shutdown()
        self.server.server_close()
