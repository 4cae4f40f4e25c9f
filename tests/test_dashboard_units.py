"""The dashboard's pure parts: the Host allowlist and Origin rule, slot labels, bar outcomes,
journal ranges for a resuming page, SSE framing, and the NVML sampler (NVML needs a real
NVIDIA GPU, which no test machine has: its module is replaced by one that answers as NVML
does)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.core.events import Ev, Finished
from gpuswarm.dashboard import sse
from gpuswarm.dashboard.gpustats import GpuStats
from gpuswarm.dashboard.runhub import outcome_of, slot_place
from gpuswarm.dashboard.security import MAX_SESSIONS, Guard, local_location, split_host
from gpuswarm.dashboard.taskview import parse_resume
from gpuswarm.store.ledger import Ledger, read_range


def test_loopback_guard_allows_loopback_literals_and_localhost_only() -> None:
    g = Guard(token="t", port=8123)
    assert g.host_ok("127.0.0.1:8123") and g.host_ok("localhost:8123") and g.host_ok("[::1]:8123")
    assert g.host_ok("localhost")  # no port: a proxy-less browser always sends it, but allowed
    assert not g.host_ok("127.0.0.1:9999")  # another port
    assert not g.host_ok("evil.example:8123")  # a rebinding name
    assert not g.host_ok("192.168.1.5:8123")  # not where it listens
    assert not g.host_ok("")


def test_bound_beyond_loopback_any_ip_literal_and_named_hosts() -> None:
    g = Guard(token="t", port=80, bind="0.0.0.0", allow_hosts=("gpu-box.lab",))
    assert g.host_ok("192.168.1.5:80") and g.host_ok("[fe80::1]:80")
    assert g.host_ok("gpu-box.lab:80") and g.host_ok("GPU-BOX.lab")
    assert not g.host_ok("evil.example:80")
    assert g.url("192.168.1.5") == "http://192.168.1.5:80/?token=t"  # the token stays


def test_origin_must_be_this_server_under_its_host() -> None:
    g = Guard(token="t", port=8123)
    assert g.origin_ok("http://127.0.0.1:8123", "127.0.0.1:8123")
    assert not g.origin_ok("http://localhost:8123", "127.0.0.1:8123")
    assert not g.origin_ok("null", "127.0.0.1:8123")
    assert not g.origin_ok(None, "127.0.0.1:8123")
    assert g.token_ok("t") and not g.token_ok("T") and not g.token_ok(None)


def test_sessions_are_minted_by_login_and_bounded() -> None:
    g = Guard(token="t", port=8123)
    assert not g.session_ok("t") and not g.session_ok("") and not g.session_ok(None)
    first = g.login()
    assert g.session_ok(first) and first != "t" and len(first) >= 40
    assert not g.session_ok(first[:-1]) and not g.session_ok(first + "x")
    later = [g.login() for _ in range(MAX_SESSIONS)]
    assert not g.session_ok(first)  # the oldest went first
    assert all(g.session_ok(s) for s in later) and len(set(later)) == MAX_SESSIONS


def test_login_redirect_goes_only_to_a_path_of_this_server() -> None:
    assert local_location("/", {"token": "t"}) == "/"
    assert local_location("/x", {"token": "t", "a": "1"}) == "/x?a=1"
    assert local_location("/run/a b", {}) == "/run/a%20b"
    for path in (
        "//evil.example/x",
        "/\\evil.example/x",
        "/x\\y",
        "http://evil.example/",
        "evil.example",
        "",
        "///x",
    ):
        assert local_location(path, {"token": "t"}) == "/", path
    assert "\n" not in local_location("/x\r\nSet-Cookie: a=b", {})  # no header injection


def test_client_numbers_are_bounded_ascii_digits() -> None:
    assert sse.number("12") == 12 and sse.number(" 7 ") == 7
    for bad in ("9" * 5000, "9" * 19, "\u00b2", "\u0663", "-1", "1e3", "", None):
        assert sse.number(bad) is None, bad
    assert sse.last_event_id("9" * 5000) is None
    assert parse_resume("1:" + "9" * 5000) is None and parse_resume("9" * 5000 + ":1") is None
    assert parse_resume("2:10") == (2, 10) and parse_resume("0:10") is None


def test_split_host() -> None:
    assert split_host("[::1]:8080") == ("[::1]", "8080")
    assert split_host("Name:80") == ("name", "80")
    assert split_host("name") == ("name", "")


def test_slot_labels_name_host_and_gpus() -> None:
    assert slot_place("box-gpu3") == ("box", [3])
    assert slot_place("my-box-gpu0+1.2") == ("my-box", [0, 1])
    assert slot_place("reclaimer") == ("", [])


def test_bar_outcomes() -> None:
    def fin(**kw: Any) -> Finished:
        return Finished(task="t", slot="s", **kw)

    assert outcome_of(fin(state="done")) == "done"
    assert outcome_of(fin(state="failed", reason="exit 1")) == "failed"
    assert outcome_of(fin(state="failed", reason="timeout after 5s (TERM)")) == "timeout"
    assert outcome_of(fin(state="waiting", retry=True, reason="exit 1")) == "retried"
    assert outcome_of(fin(state="pending", retry=True, reason="timeout after 5s")) == "timeout"
    assert outcome_of(fin(state="skipped")) == "skipped"


def test_read_range_only_from_a_line_start(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    ledger = Ledger(path)
    ledger.emit(Ev.CONTROL, request="pause", by="a", applied_by="a")
    first = path.stat().st_size
    ledger.emit(Ev.CONTROL, request="unpause", by="a", applied_by="a")
    end = path.stat().st_size
    ledger.close()
    got = read_range(path, first, end)
    assert got is not None and [e["request"] for e in got] == ["unpause"]
    assert read_range(path, 0, end) is not None
    assert read_range(path, 5, end) is None  # the middle of a line
    assert read_range(path, first, end + 10) is None  # past the end
    assert read_range(path, end, first) is None


def test_sse_frames_are_one_json_line() -> None:
    raw = sse.frame("update", {"text": "a\nb\n\ndata: x"}, 42).decode()
    assert raw.startswith("id: 42\nevent: update\n")
    data = [line for line in raw.split("\n") if line.startswith("data: ")]
    assert len(data) == 1 and json.loads(data[0][6:])["text"] == "a\nb\n\ndata: x"
    assert raw.endswith("\n\n")
    assert sse.last_event_id(" 17 ") == 17
    assert sse.last_event_id("1:2") is None and sse.last_event_id(None) is None


class _Mem:
    used = 3 << 30
    total = 80 << 30


class _Util:
    gpu = 57


def _fake_nvml(count: int) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    calls: dict[str, int] = {"init": 0}

    def init() -> None:
        calls["init"] += 1

    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: count  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: _Mem()  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetUtilizationRates = lambda h: _Util()  # type: ignore[attr-defined]
    nvml.calls = calls  # type: ignore[attr-defined]
    return nvml


def test_nvml_numbers_for_nvidia_runs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(2))
    stats = GpuStats("nvidia", "box")
    assert stats.works
    got = stats.sample()
    assert got[1] == {"index": 1, "util": 57, "mem_used": 3 << 30, "mem_total": 80 << 30}
    assert stats.sample() is got  # sampled once a second at most, whatever the pages
    assert not GpuStats("sim", "box").works and GpuStats("sim", "box").sample() == {}


def test_nvml_without_a_driver_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = _fake_nvml(1)

    def fail() -> None:
        raise OSError("NVML Shared Library Not Found")

    broken.nvmlInit = fail  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    stats = GpuStats("nvidia", "box")
    assert not stats.works and stats.sample() == {}


def test_the_experiment_page_reads_results_tsv_by_the_columns_settle_writes() -> None:
    from gpuswarm.dashboard.experiments import TSV_COLUMNS
    from gpuswarm.research.settle import HEADER

    assert len(TSV_COLUMNS) == len(HEADER)  # the metric's column is named per experiment
    assert TSV_COLUMNS[0] == HEADER[0] and TSV_COLUMNS[2:] == tuple(HEADER[2:])
