"""``notify:`` (issue 37): webhooks on the events people wait for (docs/notifications.md).

```yaml
notify:
  url_env: SLACK_WEBHOOK          # or url: https://... (the URL is a secret for Slack: prefer
  format: slack                   #  url_env, the variable's name is all run.json keeps)
  signature_env: WEBHOOK_SECRET      # X-Gpuswarm-Signature: sha256=HMAC(secret, body)
  events: [run_finished, task_failed]   # default: every event
  failed_every: 10                # task_failed: the first 3 one by one, then a summary every 10
```
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from gpuswarm.config.values import Duration, EnvName
from gpuswarm.core.errors import BadInputError

_C = TypeVar("_C", bound=BaseModel)  # a config model with a notify: field

#: every event a webhook can be told of (docs/notifications.md)
EVENTS = (
    "run_finished",
    "run_stopped",
    "task_failed",
    "gpu_quarantined",
    "budget_reached",
    "stalled",
    "kept",
)


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise ValueError("a webhook URL starts with http:// or https://")
    return text


def _event(name: str) -> str:
    if name not in EVENTS:
        raise ValueError(f"unknown event {name!r}; events: {', '.join(EVENTS)}")
    return name


Url = Annotated[str, AfterValidator(_url)]


class NotifyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    url: Url | None = None
    url_env: EnvName | None = None  # the variable holding the URL (a Slack URL is a secret)
    format: Literal["json", "slack"] = "json"
    # the variable holding the HMAC-SHA256 secret (its name: no "secret" in it, run.json keeps it)
    signature_env: EnvName | None = None
    events: list[Annotated[str, AfterValidator(_event)]] | None = None  # None: all
    failed_every: int = Field(default=10, ge=1, le=1_000_000)  # task_failed summary period
    failed_first: int = Field(default=3, ge=0, le=1000)  # sent one by one before summaries
    timeout: Duration = 5.0  # one delivery's HTTP timeout
    retries: int = Field(default=5, ge=0, le=20)  # after the first try; backoff 1, 2, 4 s...
    end_wait: Duration = 10.0  # a run's end waits at most this long for pending deliveries
    dashboard: str | None = None  # the dashboard's URL for links (without its token)

    @model_validator(mode="after")
    def _one_url(self) -> NotifyConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give the webhook as url: or url_env: (one of them)")
        return self

    def wants(self, event: str) -> bool:
        return self.events is None or event in self.events


def with_notify(config: _C, url: str) -> _C:
    """``--notify URL``: the config's ``notify:`` with this URL (its other settings kept)."""
    try:
        url = _url(url)
    except ValueError as exc:
        raise BadInputError(f"--notify {url}: {exc}") from None
    base = getattr(config, "notify", None) or NotifyConfig(url=url)
    return config.model_copy(
        update={"notify": base.model_copy(update={"url": url, "url_env": None})}
    )
