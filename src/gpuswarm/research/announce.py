"""Issue 37: a kept improvement announced on the experiment's webhook (``research init
--notify URL``: ``ExperimentConfig.notify``), by the process that decided it (a research
command or the loop: no runner has to be alive then). The delivery runs on its own thread;
the decision is journaled first, and the process waits at most ``notify.end_wait`` for it.
Every try is a line of the experiment's ``notify.jsonl``."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from gpuswarm.core.redact import redact_shapes
from gpuswarm.notify.deliver import Deliverer
from gpuswarm.notify.notifier import slack, url_of
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths
from gpuswarm.research.journal import Variant


def announce_kept(
    paths: ExpPaths, cfg: ExperimentConfig, v: Variant, metric: dict[str, object] | None
) -> None:
    note = cfg.notify
    if note is None or not note.wants("kept"):
        return
    try:
        url = url_of(note, os.environ)
    except Exception:  # an unset url_env: no webhook, never a failed decision
        return
    value = metric.get("value") if metric else None
    description = redact_shapes(v.description)
    payload: dict[str, Any] = {
        "event": "kept",
        "experiment": cfg.tag,
        "variant": v.id,
        "commit": v.commit,
        "metric": float(value) if isinstance(value, int | float) else None,
        "goal": cfg.goal,
        "energy_j": (v.finished or {}).get("energy_j"),
        "host": socket.gethostname(),
        "ts": round(time.time(), 3),
        "text": f"gpuswarm research {cfg.tag}: kept {v.id} ({description}): {cfg.metric} {value}",
    }
    if note.dashboard:
        payload["dashboard"] = note.dashboard.rstrip("/") + "/"
    secret = os.environ.get(note.signature_env, "") if note.signature_env else ""
    sender = Deliverer(
        url,
        paths.root / "notify.jsonl",
        secret=secret or None,
        timeout=note.timeout,
        retries=note.retries,
    )
    sender.send("kept", slack(payload) if note.format == "slack" else payload)
    sender.close(note.end_wait)
