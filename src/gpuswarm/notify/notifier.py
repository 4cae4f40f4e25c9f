"""The notifier: a thread that follows the run's journal (``ui.watch.Follower``, from the
moment it starts) and turns the lines people wait for into notifications; the supervisor only
starts it and, at the end, says how the run ended (:meth:`Notifier.finish`).

Events (docs/notifications.md):

- ``task_failed``: a task failed for good (no attempt left). The first ``failed_first`` are
  sent one by one; after them one summary every ``failed_every`` failures, and the rest in
  the run's last word;
- ``gpu_quarantined``: a slot quarantined (its GPU kept failing while the others worked);
- ``budget_reached`` / ``stalled``: journal lines of those names (:data:`BUDGET_REACHED`,
  :data:`STALLED`), written by whatever decides them (the budget, a stall watch), passed on
  with their fields;
- ``kept``: a research change kept (sent by research's settle: ``research/announce.py``);
- ``run_finished`` / ``run_stopped``: the run's last word, with its counts.

Every text is redacted (``core/redact``: the run's secret values, then shapes); the payload
never holds the webhook's URL or secret.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gpuswarm.config.notify import NotifyConfig
from gpuswarm.core.events import Ev, Event, Finished, Other, Quarantined
from gpuswarm.core.models import State
from gpuswarm.core.paths import RunPaths
from gpuswarm.core.words import counted
from gpuswarm.notify.deliver import Deliverer
from gpuswarm.ui.watch import Follower

POLL_SECONDS = 0.5
BUDGET_REACHED = "budget_reached"  # the notifications of the budget and the stall watch
STALLED = "stalled"


def _hook_name(e: Other) -> str | None:
    """The notification of a budget or stall journal line: the budget's ``budget`` line once
    it is crossed (``crossed: true``; supervise/budget.py), the stall watch's ``stalled``."""
    if e.name == Ev.BUDGET.value and e.extra.get("crossed") is True:
        return BUDGET_REACHED
    return e.name if e.name in (BUDGET_REACHED, STALLED) else None


class NotifyError(Exception):
    pass


def url_of(cfg: NotifyConfig, env: Mapping[str, str]) -> str:
    if cfg.url is not None:
        return cfg.url
    url = env.get(cfg.url_env or "", "")
    if not url.startswith(("http://", "https://")):
        raise NotifyError(f"notify: url_env {cfg.url_env} is not set to an http(s) URL")
    return url


class Notifier:
    def __init__(
        self,
        paths: RunPaths,
        cfg: NotifyConfig,
        *,
        title: str,
        redact: Callable[[str], str],
        env: Mapping[str, str] | None = None,
        backoff: float = 1.0,
        experiment: str | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.paths = paths
        self.cfg = cfg
        self.title = title
        self.redact = redact
        self.host = socket.gethostname()
        self.failed = 0
        self._follower = Follower(paths)
        # a research experiment's core run: no run_finished per runner (research announces
        # its keeps itself: research/announce.py)
        self.experiment = experiment
        self._extra = {"experiment": experiment} if experiment else {}
        self._stop = threading.Event()
        secret = env.get(cfg.signature_env, "") if cfg.signature_env else None
        self.deliverer = Deliverer(
            url_of(cfg, env),
            paths.notify_log,
            secret=secret or None,
            timeout=cfg.timeout,
            retries=cfg.retries,
            backoff=backoff,
        )
        self._thread = threading.Thread(target=self._serve, name="notifier", daemon=True)
        self._thread.start()

    # -- the thread ----------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self._poll()

    def _poll(self) -> None:
        try:
            events = self._follower.poll()
        except OSError:
            return
        for event in events:
            if not isinstance(event, dict):
                self._on(event)

    def _on(self, e: Event) -> None:
        if isinstance(e, Finished) and e.state == State.FAILED.value and not e.retry:
            self._failed(e)
        elif isinstance(e, Quarantined):
            why = self.redact(e.reason or "")
            self.emit("gpu_quarantined", f"slot {e.slot} quarantined: {why}", slot=e.slot)
        elif isinstance(e, Other) and (name := _hook_name(e)) is not None:
            extra = {k: v for k, v in e.extra.items() if isinstance(v, str | int | float)}
            extra.pop("crossed", None)
            reason = self.redact(str(extra.pop("reason", "") or name.replace("_", " ")))
            self.emit(name, reason, **{k: self._clean(v) for k, v in extra.items()})

    def _clean(self, value: Any) -> Any:
        return self.redact(value) if isinstance(value, str) else value

    def _failed(self, e: Finished) -> None:
        self.failed += 1
        n, first, every = self.failed, self.cfg.failed_first, self.cfg.failed_every
        if n <= first:
            why = self.redact(e.reason or "")
            self.emit("task_failed", f"task {e.task} failed: {why}", task=e.task, failed=n)
        elif (n - first) % every == 0:
            self.emit("task_failed", f"{counted(n, 'task')} failed so far", failed=n)

    # -- payloads ------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        with self._follower.view.lock:
            return dict(self._follower.view.counts)

    def emit(self, event: str, text: str, **fields: Any) -> None:
        if not self.cfg.wants(event):
            return
        payload: dict[str, Any] = {
            "event": event,
            "run": self.title,
            "run_dir": str(self.paths.root),
            "host": self.host,
            "ts": round(time.time(), 3),
            "text": f"gpuswarm {self.title}: {text}",
            "counts": self.counts(),
            **self._extra,
            **fields,
        }
        if self.cfg.dashboard:
            payload["dashboard"] = run_page(self.cfg.dashboard, self.paths)
        if self.cfg.format == "slack":
            payload = slack(payload)
        self.deliverer.send(event, payload)

    def finish(self, *, stopped: bool, why: str | None = None) -> None:
        """The run ended: the journal's last lines, the run's last word, then at most
        ``end_wait`` seconds for what is still to be delivered."""
        self._stop.set()
        self._thread.join(5.0)
        self._poll()
        if self.experiment is not None:  # a research runner ends after each idle spell
            self.deliverer.close(self.cfg.end_wait)
            return
        counts = self.counts()
        summary = ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "no task"
        if stopped:
            text = f"stopped ({self.redact(why or 'stop requested')}): {summary}"
            self.emit("run_stopped", text, reason=self.redact(why or ""))
        else:
            self.emit("run_finished", f"finished: {summary}", failed=self.failed)
        self.deliverer.close(self.cfg.end_wait)


def run_page(dashboard: str, paths: RunPaths) -> str:
    """The run's page on the dashboard at ``dashboard``: its id is the digest of its folder's
    path (``dashboard.catalog.ident``: stable across restarts); opened once with the token,
    the browser keeps its session."""
    rid = "r" + hashlib.sha256(str(paths.root).encode()).hexdigest()[:10]
    base = urlsplit(dashboard)  # the printed URL pasted whole: its ?token= never goes out
    return f"{urlunsplit(base._replace(query='', fragment='')).rstrip('/')}/#/run/{rid}"


def slack(payload: dict[str, Any]) -> dict[str, Any]:
    """A Slack/Mattermost incoming-webhook body: ``text`` (with the link), the rest as fields."""
    text = str(payload["text"])
    if payload.get("dashboard"):
        text += f" <{payload['dashboard']}|dashboard>"
    counts = payload.get("counts") or {}
    fields = [{"title": k, "value": str(v), "short": True} for k, v in counts.items() if v]
    return {"text": text, "attachments": [{"fields": fields}] if fields else []}
