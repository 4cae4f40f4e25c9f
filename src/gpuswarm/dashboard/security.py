"""Who may talk to the dashboard: one ASGI middleware in front of every route.

- **Host allowlist** (DNS rebinding): the Host header must be an IP literal (a rebinding attack
  needs a name it controls), ``localhost``, this machine's names when bound beyond loopback, or
  a name given with ``--allow-host``. Anything else is 403 before anything else is looked at.
- **Token**: the URL printed at start carries ``?token=``; a request with it gets the token as
  an HttpOnly, SameSite=Strict cookie (named after the port: cookies ignore ports) and a
  redirect to the same URL without it. Every other request needs the cookie: 403 otherwise.
- **Actions** (every method but GET/HEAD): the token again in ``X-Gpuswarm-Token`` (the page
  has it from its own HTML; another origin can read neither) and an ``Origin`` that is this
  server's; no CORS headers are ever sent, so no other origin can read an answer.
- **Headers** on every answer: ``Content-Security-Policy: default-src 'self'`` (no inline script,
  no other origin), nosniff, no referrer, no framing, no caching.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_HEADER = "x-gpuswarm-token"
CSP = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
SAFE_METHODS = ("GET", "HEAD")


def new_token() -> str:
    return secrets.token_urlsafe(24)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def split_host(value: str) -> tuple[str, str]:
    """``host``, ``port`` of a Host header (``[::1]:8080``, ``name:80``, ``name``)."""
    if value.startswith("["):
        end = value.find("]")
        host, rest = value[: end + 1], value[end + 1 :]
        return host.lower(), rest[1:] if rest.startswith(":") else ""
    host, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return host.lower(), port


def loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return address == "localhost"


@dataclass
class Guard:
    """The dashboard's security settings (one per server)."""

    token: str
    port: int
    bind: str = "127.0.0.1"
    allow_hosts: Iterable[str] = ()
    names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.names = {"localhost", *(h.lower() for h in self.allow_hosts)}
        if not loopback(self.bind):  # reachable by this machine's names too
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    self.names.add(name.lower())

    @property
    def cookie(self) -> str:
        return f"gpuswarm_dashboard_{self.port}"

    def host_ok(self, value: str) -> bool:
        host, port = split_host(value)
        if port and port != str(self.port):
            return False
        if _is_ip(host):
            return loopback(host) if loopback(self.bind) else True
        return host in self.names

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def origin_ok(self, origin: str | None, host: str) -> bool:
        """An action's Origin: this server, under the Host it was asked by."""
        return origin is not None and origin.lower() == f"http://{host.lower()}"

    def url(self, host: str) -> str:
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/?{urlencode({'token': self.token})}"


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}


async def _answer(
    send: Send, status: int, body: dict[str, Any], extra: list[Any] | None = None
) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *HEADERS,
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class GuardMiddleware:
    """The checks above, in that order, then security headers on whatever the app answers."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        g = self.guard
        headers = _headers(scope)
        host = headers.get("host", "")
        if not g.host_ok(host):
            await _answer(send, 403, {"error": f"host {host!r} is not allowed"})
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if scope["method"] == "GET" and "token" in query:
            if not g.token_ok(query["token"]):
                await _answer(
                    send, 403, {"error": "wrong token: use the URL the dashboard printed"}
                )
                return
            await self._login(scope, send, query)
            return
        cookies = SimpleCookie()
        try:
            cookies.load(headers.get("cookie", ""))
        except Exception:  # a malformed Cookie header: as if none was sent
            cookies = SimpleCookie()
        jar = cookies.get(g.cookie)
        if not g.token_ok(jar.value if jar is not None else None):
            await _answer(
                send,
                403,
                {"error": "no token: open the URL with ?token= that the dashboard printed"},
            )
            return
        if scope["method"] not in SAFE_METHODS:
            if not g.token_ok(headers.get(TOKEN_HEADER)):
                await _answer(send, 403, {"error": f"an action needs the {TOKEN_HEADER} header"})
                return
            if not g.origin_ok(headers.get("origin"), host):
                await _answer(
                    send, 403, {"error": "an action must come from this dashboard's page"}
                )
                return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)

    async def _login(self, scope: Scope, send: Send, query: dict[str, str]) -> None:
        """The token in the URL becomes a cookie; the browser goes on without it in the URL."""
        rest = {k: v for k, v in query.items() if k != "token"}
        location = scope.get("path", "/") + (f"?{urlencode(rest)}" if rest else "")
        cookie = f"{self.guard.cookie}={self.guard.token}; HttpOnly; SameSite=Strict; Path=/"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode()),
                    (b"set-cookie", cookie.encode()),
                    (b"content-length", b"0"),
                    *HEADERS,
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})
