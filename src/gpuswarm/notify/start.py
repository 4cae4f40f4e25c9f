"""The run's notifier from its run.json (``config.notify``), or None without one. A notify
block that cannot be used (a ``url_env`` not set) is said once on stderr: notifications never
stop a run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gpuswarm.config.notify import NotifyConfig
from gpuswarm.core.paths import RunPaths
from gpuswarm.store.runinfo import RunRecord

if TYPE_CHECKING:  # a run without a notify block never loads the HTTP stack (issue 31)
    from gpuswarm.notify.notifier import Notifier


def notifier_for(
    paths: RunPaths, info: RunRecord, redact: Callable[[str], str], mode: str = "run"
) -> Notifier | None:
    """``mode`` work (a supervisor joining a live run): none, the run's first supervisor
    notifies (two would send every event twice)."""
    raw = info.config.get("notify")
    if not raw or mode == "work":
        return None
    from gpuswarm.notify.notifier import Notifier, NotifyError  # urllib, http.client, ssl

    try:
        cfg = NotifyConfig.model_validate(raw)
        research = info.config.get("research")
        experiment = research if isinstance(research, str) and research else None
        return Notifier(paths, cfg, title=_title(paths, info), redact=redact, experiment=experiment)
    except (ValidationError, NotifyError) as exc:
        first = str(exc).splitlines()[0] if isinstance(exc, NotifyError) else _first(exc)
        print(f"gpuswarm: notify: {first}; no webhook for this run", file=sys.stderr)
        return None


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))


def _title(paths: RunPaths, info: RunRecord) -> str:
    return f"{info.name}/{paths.root.name}" if info.name else paths.root.name


def last_word(notifier: Notifier | None, *, stopped: bool, why: str | None) -> Notifier | None:
    """The run ended (``stopped``: by a stop, with ``why``): its notifier's last word, then
    at most ``notify.end_wait`` seconds for pending deliveries. Always None (the caller's
    notifier is done with)."""
    if notifier is not None:
        notifier.finish(stopped=stopped, why=why)
    return None
