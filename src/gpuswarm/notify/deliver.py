"""Deliveries: one thread POSTs each notification, retried with backoff, each try journaled.

The thread that queues a notification never waits: :meth:`Deliverer.send` puts it on a
bounded queue (full: the notification is journaled ``dropped``). A receiver that hangs costs
its ``timeout`` per try on this thread only; one that refuses connections costs nothing but
the retries. :meth:`Deliverer.close` waits at most ``wait`` seconds for what is pending (a
retry's backoff is cut short then); what is left is journaled ``dropped``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUEUE_SIZE = 1000
MAX_BACKOFF_SECONDS = 30.0
SIGNATURE_HEADER = "X-Gpuswarm-Signature"


@dataclass
class Delivery:
    event: str
    body: bytes
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256(secret, "<timestamp>." + body)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class Deliverer:
    def __init__(
        self,
        url: str,
        journal: Path,
        *,
        secret: str | None = None,
        timeout: float = 5.0,
        retries: int = 5,
        backoff: float = 1.0,
    ) -> None:
        self._url = url
        self._secret = secret
        self.journal = journal
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._queue: queue.Queue[Delivery | None] = queue.Queue(QUEUE_SIZE)
        self._closing = threading.Event()
        self._current: Delivery | None = None  # the one being delivered
        self._journal_lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="notify", daemon=True)
        self._thread.start()

    def send(self, event: str, payload: dict[str, Any]) -> None:
        """Queue one notification (never blocks)."""
        item = Delivery(event, json.dumps(payload, separators=(",", ":")).encode())
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._log(item, 0, "dropped", "the delivery queue is full")

    def close(self, wait: float) -> None:
        """Deliver what is pending for at most ``wait`` seconds, then give up on the rest."""
        deadline = time.monotonic() + max(0.0, wait)
        self._queue.put(None)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._closing.set()  # retries stop waiting; a try in flight is left to its timeout
        current = self._current
        if self._thread.is_alive() and current is not None:  # a daemon: it ends with us
            self._log(current, 0, "dropped", "the run ended during its delivery")
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._log(item, 0, "dropped", "the run ended before it could be delivered")

    # -- the thread ----------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._current = item
            self._deliver(item)
            self._current = None

    def _deliver(self, item: Delivery) -> None:
        for n in range(1, self.retries + 2):
            if n > 1 and self._closing.is_set():
                self._log(item, n, "dropped", "the run ended during the retries")
                return
            ok, why = self._post(item)
            if ok:
                self._log(item, n, "delivered", why)
                return
            last = n == self.retries + 1
            self._log(item, n, "failed" if last else "retrying", why)
            if last:
                return
            delay = min(MAX_BACKOFF_SECONDS, self.backoff * 2 ** (n - 1))
            if self._closing.wait(delay):
                self._log(item, n + 1, "dropped", "the run ended during the retries")
                return

    def _post(self, item: Delivery) -> tuple[bool, str]:
        ts = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "gpuswarm-notify",
            "X-Gpuswarm-Event": item.event,
            "X-Gpuswarm-Delivery": item.id,
            "X-Gpuswarm-Timestamp": ts,
        }
        if self._secret:
            headers[SIGNATURE_HEADER] = signature(self._secret, ts, item.body)
        req = urllib.request.Request(self._url, data=item.body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return 200 <= r.status < 300, f"HTTP {r.status}"
        except urllib.error.HTTPError as exc:
            return False, f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:  # refused, unreachable, timed out
            reason = getattr(exc, "reason", exc)
            return False, type(reason).__name__ + (f": {reason}" if str(reason) else "")

    def _log(self, item: Delivery, n: int, outcome: str, why: str) -> None:
        """One line per try (never the URL, which may be a secret, nor the body)."""
        line = {
            "ts": round(time.time(), 3),
            "delivery": item.id,
            "event": item.event,
            "try": n,
            "outcome": outcome,
            "detail": why[:300],
        }
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        with self._journal_lock:
            try:
                with self.journal.open("ab") as fh:
                    fh.write(data)
            except OSError:
                pass  # the journal is best effort: a delivery never fails the run
