"""The loop's wait for news while a proposer thinks (no processes: the runner watch is a fake).

A slow agent (minutes per proposal) with nothing in flight must not make the loop restart the
idle runner: each restart ended after its linger without running anything, and three of them
ended the loop with "the background runner keeps stopping without running anything".
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpuswarm.research import executor, loop, readouts, runner
from gpuswarm.research.proposers import Proposal


class Watch:
    def __init__(self) -> None:
        self.checks = 0

    def check(self) -> None:
        self.checks += 1

    def progressed(self) -> None:
        pass


def wait(in_flight: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(executor, "finished_ids", lambda paths, cfg: set())
    monkeypatch.setattr(readouts, "RUNNER_CHECK_SECONDS", 0.0)
    watch = Watch()
    state = SimpleNamespace(in_flight=lambda: [SimpleNamespace(id=i) for i in in_flight])
    thinking: Future[Proposal | None] = Future()  # an agent that has not answered yet
    stop = loop.LoopStop(threading.Event(), threading.Event())
    loop._wait_for_news(
        cast(Any, SimpleNamespace(paths=None, cfg=None)),
        cast(Any, state),
        stop,
        cast(runner.RunnerWatch, watch),
        time.monotonic() + 0.5,
        lambda s: None,
        {thinking},
    )
    return watch.checks


def test_no_runner_restarts_while_only_an_agent_thinks(monkeypatch: pytest.MonkeyPatch) -> None:
    assert wait([], monkeypatch) == 0


def test_the_runner_is_watched_while_variants_are_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert wait(["v0001"], monkeypatch) > 0
