"""The dashboard's HTTP answers: compact JSON, errors as ``{"error": ...}``, Server-Sent Event
streams, a query's numbers, and the app's handlers of what is not found or malformed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gpuswarm.dashboard import sse


class NotFoundError(Exception):
    """No run, experiment or task of that id here: a 404 naming it."""


def json_response(data: object) -> Response:
    """Compact JSON (no spaces; what is no JSON type, e.g. a path: its text)."""
    return Response(
        json.dumps(data, separators=(",", ":"), default=str).encode(),
        media_type="application/json",
    )


def error_response(status: int, message: str) -> Response:
    """``{"error": message}`` with ``status``: what the page shows."""
    return JSONResponse({"error": message}, status_code=status)


def query_number(value: str | None, default: int) -> int:
    """A query parameter's whole number (``offset``, ``limit``), ``default`` when absent or bad."""
    found = sse.number(value)
    return default if found is None else found


def event_stream(body: AsyncIterator[bytes]) -> Response:
    """Server-Sent Events, never buffered by a proxy in between."""
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"X-Accel-Buffering": "no"},
    )


async def not_found(request: Request, exc: Exception) -> Response:
    """The app's handler of :class:`NotFoundError` and a task not found: 404."""
    return error_response(404, str(exc))


async def bad_input(request: Request, exc: Exception) -> Response:
    """The app's handler of bad input (a malformed query or body): 400."""
    return error_response(400, str(exc))
