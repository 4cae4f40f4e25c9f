"""Who may talk to the dashboard: one ASGI middleware in front of every route.

The threat model (docs/dashboard.md, "Security"): other programs on this machine may listen on
127.0.0.1 too (a notebook, a dev server, another user's listener), and a browser sends a
cookie to every port of a host. So no cookie authorises anything here: a cookie of this
dashboard would reach those servers, and they could replay it.

- **Host allowlist** (DNS rebinding): the Host header must be an IP literal (a rebinding attack
  needs a name it controls), ``localhost``, this machine's names when bound beyond loopback, or
  a name given with ``--allow-host``. Anything else is 403 before anything else is looked at.
- **The URL's token is exchanged once per visit**: ``GET /?token=T`` (the URL printed at start)
  mints a random *session* and answers 303 to the same path without the token, the session in
  the fragment (``/#session=S``: a fragment is never sent to any server). The page moves it to
  its origin's ``localStorage`` (an origin includes the port: no other server's page can read
  it) and drops it from the address bar and history (``history.replaceState``). The redirect
  goes only to a path of this server (``/x``; never ``//host``, ``/\\host`` or a scheme).
- **Every API request needs the session** in ``X-Gpuswarm-Session`` (an EventSource, which
  cannot set headers, sends it as ``?session=`` on its GET; only a request that asks for
  ``text/event-stream`` may). The page and its script and style are public: they are the
  package's files and hold nothing of a run.
- **Actions** (every method but GET/HEAD): the session header (the query never counts) and an
  ``Origin`` that is this server's; no CORS headers are ever sent, so no other origin can read
  an answer.
- **``/metrics``** (issue 37: Prometheus) needs ``Authorization: Bearer <token>``, the URL's
  token itself: a scraper has no page to hold a session, and no cookie or session counts there.
- **Headers** on every answer: ``Content-Security-Policy: default-src 'self'`` (no inline script,
  no other origin), nosniff, no referrer, no framing, no caching.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import secrets
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from gpuswarm.metrics.exporter import bearer_ok

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_HEADER = "x-gpuswarm-session"
SESSION_QUERY = "session"
MAX_SESSIONS = 64  # one per opening of the URL; the oldest goes first
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
PUBLIC = re.compile(r"/(?:static/[A-Za-z0-9._-]+)?")  # the page, its script, style and icon
# a path of this server: "/" then no second "/" or "\" (a browser reads "//x" and "/\x" as
# another host); quoted first, so only these characters remain
_LOCAL_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9._~!$&'()*+,;=:@%/-]*")
_PATH_SAFE = "/-._~!$&'()*+,;=:@"
NO_SESSION = "no session: open the URL with ?token= that `gpuswarm dashboard` printed"
METRICS_PATH = "/metrics"
NO_BEARER = "/metrics needs 'Authorization: Bearer <token>' (the token of the printed URL)"


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


def local_location(path: str, query: dict[str, str]) -> str:
    """Where the login redirect may go: ``path`` (and the query but ``token``) when it is a
    path of this server, else ``/``; never another host (``//h``, ``/\\h``, ``http:...``)."""
    if not path.startswith("/") or path[1:2] in ("/", "\\") or "\\" in path:
        return "/"
    quoted = quote(path, safe=_PATH_SAFE)
    if _LOCAL_PATH.fullmatch(quoted) is None:
        return "/"
    rest = {k: v for k, v in query.items() if k not in ("token", SESSION_QUERY)}
    return quoted + (f"?{urlencode(rest)}" if rest else "")


@dataclass
class Guard:
    """The dashboard's security settings (one per server) and its sessions."""

    token: str
    port: int
    bind: str = "127.0.0.1"
    allow_hosts: Iterable[str] = ()
    names: set[str] = field(default_factory=set)
    sessions: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self.names = {"localhost", *(h.lower() for h in self.allow_hosts)}
        if not loopback(self.bind):  # reachable by this machine's names too
            for name in (socket.gethostname(), socket.getfqdn()):
                if name:
                    self.names.add(name.lower())

    @property
    def legacy_cookie(self) -> str:
        """The cookie older versions set (it held the token): expired at each login."""
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

    def login(self) -> str:
        """A new session (the URL's token was right)."""
        session = secrets.token_urlsafe(32)
        self.sessions[session] = None
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return session

    def session_ok(self, given: str | None) -> bool:
        if not given:
            return False
        found = False
        for known in self.sessions:  # constant time per session: no early exit
            found |= hmac.compare_digest(given.encode(), known.encode())
        return found

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


def _refusal(scope: Scope, headers: dict[str, str], query: dict[str, str], g: Guard) -> str:
    """Why a request (past the Host check and the login) is refused; "" when it may pass."""
    method = scope["method"]
    if method in SAFE_METHODS and PUBLIC.fullmatch(scope.get("path", "")):
        return ""
    session = headers.get(SESSION_HEADER)
    if (
        session is None
        and method in SAFE_METHODS
        and "text/event-stream" in headers.get("accept", "")
    ):
        session = query.get(SESSION_QUERY)
    if not g.session_ok(session):
        return NO_SESSION
    if method not in SAFE_METHODS and not g.origin_ok(headers.get("origin"), headers["host"]):
        return "an action must come from this dashboard's page"
    return ""


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
        host = headers.setdefault("host", "")
        if not g.host_ok(host):
            await _answer(send, 403, {"error": f"host {host!r} is not allowed"})
            return
        if scope.get("path") == METRICS_PATH:  # a scraper: the token as a bearer, nothing else
            if not bearer_ok(headers.get("authorization"), g.token):
                await _answer(send, 401, {"error": NO_BEARER}, [(b"www-authenticate", b"Bearer")])
                return
            await self.app(scope, receive, send)
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
        why = _refusal(scope, headers, query, g)
        if why:
            await _answer(send, 403, {"error": why})
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)

    async def _login(self, scope: Scope, send: Send, query: dict[str, str]) -> None:
        """The token in the URL becomes a session in the fragment of a redirect without it."""
        location = f"{local_location(scope.get('path', '/'), query)}#session={self.guard.login()}"
        expire = f"{self.guard.legacy_cookie}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict"
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode()),
                    (b"set-cookie", expire.encode()),
                    (b"content-length", b"0"),
                    *HEADERS,
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})
