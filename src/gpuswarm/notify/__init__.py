"""Webhooks (issue 37, docs/notifications.md): the run's journal read on a thread of its own,
the events people wait for sent to a URL, off the hot path.

- ``deliver.py``  the delivery thread: a bounded queue, HTTP POST, HMAC-SHA256 signature,
  retries with backoff, every try journaled (``.parallel/notify.jsonl``); a bounded end
- ``notifier.py`` the journal followed (``ui.watch.Follower``): which line is which event,
  the rate limit of ``task_failed``, the payloads (redacted), the run's last word

Layer: above ``ui`` (the Follower), below the engine that starts it.
"""
