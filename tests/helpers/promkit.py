"""Debian's ``prometheus`` package in tests (issue 37): ``promtool check metrics`` and a real
Prometheus server on 127.0.0.1 (temp config and data folder, a free port, a 1 s scrape).

Without the tools a test is skipped, and fails instead under ``CI=true`` or
``GPUSWARM_REQUIRE_PROMETHEUS=1`` (``.ci/run`` installs the package): CI must not pass by
skipping them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REQUIRE_ENV = "GPUSWARM_REQUIRE_PROMETHEUS"


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI", "").lower() == "true"


def tool(name: str) -> str:
    """The path of ``promtool`` / ``prometheus``; skip (fail when required) without it."""
    found = shutil.which(name)
    if found is None:
        why = f"{name} is not installed (apt install prometheus)"
        if required():
            pytest.fail(f"{why}, and CI / {REQUIRE_ENV}=1 asks for it", pytrace=False)
        pytest.skip(why)
    return found


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    def __init__(self, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.port = port
        self.proc = proc
        self.log = log

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now ([] before the first scrape)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                data = json.loads(r.read())
        except OSError:
            return []  # not listening yet
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/targets"
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                active: list[dict[str, Any]] = json.loads(r.read())["data"]["activeTargets"]
        except OSError:
            return []
        return active


@contextlib.contextmanager
def prometheus(folder: Path, jobs: list[dict[str, Any]]) -> Iterator[Prometheus]:
    """A Prometheus server scraping ``jobs`` (scrape_configs entries) every second."""
    binary = tool("prometheus")
    folder.mkdir(parents=True, exist_ok=True)
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}
    config["scrape_configs"] = jobs  # type: ignore[assignment]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Prometheus(port, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_value(server: Prometheus, promql: str, want: float, timeout: float = 60) -> float:
    """Poll ``promql`` until its one sample is ``want``; AssertionError with what was seen."""
    deadline = time.monotonic() + timeout
    seen: Any = None
    while time.monotonic() < deadline:
        result = server.query(promql)
        if len(result) == 1:
            seen = float(result[0]["value"][1])
            if seen == want:
                return want
        time.sleep(0.25)
    raise AssertionError(
        f"{promql} = {seen} (want {want}); targets: {server.targets()}; "
        f"log: {server.log.read_text(errors='replace')[-2000:]}"
    )
