"""Issue 37: the figures behind /metrics, from typed events and records (no processes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuswarm.core.events import Finished, Started, SupervisorStarted
from gpuswarm.core.models import AttemptRecord
from gpuswarm.metrics.collector import SwarmCollector
from gpuswarm.metrics.gpus import HostGpus
from gpuswarm.metrics.runstats import JournalFold, RecordFold
from gpuswarm.metrics.sources import Sources
from gpuswarm.placement.nvml import DeviceInfo, DeviceSample


def test_idle_gap_when_finished_is_journaled_after_the_next_start(tmp_path: Path) -> None:
    """The committer journals ``finished`` in batches: the slot's next ``started`` may come
    first. The gap is next start - (start + seconds), and busy time is the attempt's seconds."""
    fold = JournalFold(tmp_path / "events.jsonl")
    fold.apply(SupervisorStarted(ts=100.0, slots=["s0"]))
    fold.apply(Started(ts=100.0, task="a", attempt=1, slot="s0"))
    fold.apply(Started(ts=102.5, task="b", attempt=1, slot="s0"))  # before a's finished
    fold.apply(Finished(ts=102.6, task="a", slot="s0", attempt=1, state="done", seconds=2.0))
    fold.apply(Finished(ts=104.0, task="b", slot="s0", attempt=1, state="failed", seconds=1.0))
    fold.apply(Started(ts=110.0, task="c", attempt=1, slot="s0"))
    assert fold.idle.n == 2
    assert abs(fold.idle.total - (0.5 + 6.5)) < 1e-9
    assert fold.ended["done"] == 1 and fold.ended["failed"] == 1 and fold.started == 3
    assert abs(fold.busy_seconds("s0", 111.0) - (3.0 + 1.0)) < 1e-9  # c runs since 110
    assert abs(fold.busy_ratio("s0", 111.0) - 4.0 / 11.0) < 1e-9


def test_retries_count_as_retried(tmp_path: Path) -> None:
    fold = JournalFold(tmp_path / "events.jsonl")
    fold.apply(Started(ts=1.0, task="a", attempt=1, slot="s0"))
    fold.apply(Finished(ts=2.0, task="a", slot="s0", attempt=1, state="waiting", retry=True))
    assert fold.ended["retried"] == 1 and fold.ended["failed"] == 0


@dataclass
class _AgentRecord:  # what issue 34's records add: read where present
    n: int
    kind: str = "exited"
    peak_vram_mb: int | None = 3000
    tokens_in: int = 100
    tokens_cached: int = 40
    tokens_out: int = 7
    cost_usd: float = 0.25
    energy_j: float = 12.5
    energy_mode: str = "shared"


def test_records_counted_once_with_agent_and_energy_fields() -> None:
    fold = RecordFold()
    plain = AttemptRecord(n=1, kind="timeout")
    fold.add("t", [plain])
    fold.add("t", [plain, _AgentRecord(n=2)])  # type: ignore[list-item]
    fold.add("t", [plain, _AgentRecord(n=2)])  # type: ignore[list-item]  # seen: nothing new
    assert fold.by_kind == {"timeout": 1, "exited": 1}
    assert fold.tokens == {"tokens_in": 100, "tokens_cached": 40, "tokens_out": 7}
    assert fold.cost_usd == 0.25 and fold.energy == {"shared": 12.5}
    assert fold.vram.n == 1 and dict(fold.vram.buckets())["4096"] == 1


class _Query:
    vendor = "nvidia"

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(0, "Fake H100", "GPU-0", 81920)]

    def sample(self, key: str | int) -> DeviceSample:
        return DeviceSample(1024, 81920, 37, ())

    def energy_mj(self, key: str | int) -> int | None:
        return 5_000_000

    def power_mw(self, key: str | int) -> int | None:
        return 250_000

    def close(self) -> None:
        return None


def test_gpu_series_and_empty_sources(tmp_path: Path) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SwarmCollector(Sources([tmp_path]), HostGpus(_Query())))
    text = generate_latest(registry).decode()
    got = {
        (s.name, s.labels.get("gpu")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert got[("gpuswarm_gpu_memory_used_bytes", "0")] == 1024 * 2**20
    assert got[("gpuswarm_gpu_utilization_ratio", "0")] == 0.37
    assert got[("gpuswarm_gpu_power_watts", "0")] == 250.0
    assert got[("gpuswarm_gpu_energy_joules_total", "0")] == 5000.0
    assert got[("gpuswarm_source_errors", None)] == 0


def test_research_energy_per_experiment_and_per_kept_improvement() -> None:
    from gpuswarm.research.figures import energy_figures
    from gpuswarm.research.journal import ExperimentState, Variant

    state = ExperimentState()

    def add(vid: str, kind: str, joules: float | None, status: str) -> None:
        v = Variant(vid, kind, "c" + vid, "p", "d", 1, "mutate", 0.0)
        v.finished = {"ok": True, "energy_j": joules}
        v.decision = {"status": status}
        state.variants[vid] = v

    add("v0001", "baseline", 100.0, "keep")  # a baseline is no improvement
    add("v0002", "variant", 300.0, "keep")
    add("v0003", "variant", 200.0, "discard")
    add("v0004", "variant", None, "crash")  # not measured
    got = energy_figures(state)
    assert got == {"energy_j": 600.0, "energy_measured": 3, "energy_per_kept_j": 600.0}


def test_the_dashboard_task_record_shows_energy() -> None:
    from gpuswarm.core.redact import Redactor
    from gpuswarm.dashboard.taskview import _attempt

    rec = AttemptRecord(n=1, energy_j=1000.5, energy_mode="shared")
    got = _attempt(rec, Redactor([]))
    assert got["energy_j"] == 1000.5 and got["energy_mode"] == "shared"


def test_notifier_maps_quarantines_and_the_budget_and_stall_hooks(tmp_path: Path) -> None:
    """The journal lines a notifier turns into events (no HTTP: the deliverer is replaced)."""
    from gpuswarm.config.notify import NotifyConfig
    from gpuswarm.core.events import Ev, Other, Quarantined
    from gpuswarm.core.paths import RunPaths
    from gpuswarm.notify.notifier import Notifier

    paths = RunPaths(tmp_path)
    (tmp_path / "events.jsonl").write_text("")
    cfg = NotifyConfig(url="http://127.0.0.1:9/", failed_first=1, failed_every=2)
    n = Notifier(paths, cfg, title="r/run_1", redact=lambda t: t.replace("sk-live", "***"))
    sent: list[tuple[str, dict[str, object]]] = []
    n.deliverer.send = lambda event, payload: sent.append((event, payload))  # type: ignore[method-assign]
    n._on(Quarantined(slot="h-gpu1", reason="CUDA error sk-live"))
    # the budget's own line (supervise/budget.py): a note is no notification, a crossing is
    n._on(Other(name=Ev.BUDGET.value, extra={"reason": "unknown cost", "crossed": False}))
    n._on(
        Other(
            name=Ev.BUDGET.value,
            extra={"reason": "cost 5.00 USD of 5.00", "usd": 5.0, "crossed": True},
        )
    )
    n._on(Other(name=Ev.STALLED.value, extra={"seconds": 600}))
    for _ in range(3):
        n._on(Finished(task="t", slot="s", state="failed", reason="exit 1"))
    n.finish(stopped=False)
    events = [e for e, _ in sent]
    assert events == [
        "gpu_quarantined",
        "budget_reached",
        "stalled",
        "task_failed",
        "task_failed",
        "run_finished",
    ]
    assert "sk-live" not in str(sent) and sent[1][1]["usd"] == 5.0 and "crossed" not in sent[1][1]
    assert sent[4][1]["failed"] == 3 and "task" not in sent[4][1]  # the summary of 3


def test_a_webhook_s_dashboard_link_never_carries_the_token() -> None:
    """``notify.dashboard`` given as the URL the dashboard printed (with its token): the link
    in every payload is the run's page without it."""
    from gpuswarm.core.paths import RunPaths
    from gpuswarm.notify.notifier import run_page

    paths = RunPaths(Path("/w/runs/r/run_1"))
    plain = run_page("http://127.0.0.1:8765", paths)
    assert plain.startswith("http://127.0.0.1:8765/#/run/r") and len(plain) == 39
    for given in ("http://127.0.0.1:8765/?token=Tk-1234", "http://127.0.0.1:8765?token=Tk-1234#/x"):
        assert run_page(given, paths) == plain


def test_the_exporter_loads_no_dashboard_stack() -> None:
    """``gpuswarm exporter`` works with the base install (prometheus_client is a dependency):
    neither Starlette nor uvicorn is imported by it."""
    import subprocess
    import sys

    code = (
        "import sys, gpuswarm.cli.exporter, gpuswarm.metrics.exporter;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('starlette', 'uvicorn')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


def test_a_removed_run_leaves_the_series(tmp_path: Path) -> None:
    import shutil

    from gpuswarm.app.api import GpuPlan, NewRunSpec, create_run

    run = create_run(
        NewRunSpec(
            workspace=tmp_path,
            folder="gone",
            name="gone",
            base_dir=tmp_path,
            gpus=GpuPlan(spec="sim:1", vendor="sim", ids=(0,), slot_count=1),
            source="test",
        )
    )
    sources = Sources([tmp_path])
    sources.refresh()
    assert list(sources.runs) == [run.root]
    shutil.rmtree(run.root)
    sources._scanned = -1e9  # the next refresh looks again
    sources.refresh()
    assert sources.runs == {} and sources.errors == {}
