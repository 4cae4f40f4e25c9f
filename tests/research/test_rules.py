"""The seed's decision rules (simplicity, VRAM as a soft constraint, noise, one baseline per
platform) and the replay of a ledger under other settings, on recorded ledgers: each test writes
the ledger.jsonl lines an experiment journals (init, variant, finished, decided, sealed), replays
them into the state every research command settles from, and asks the policy. No processes, no
git."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuswarm.research import rules
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths, metric_pattern
from gpuswarm.research.journal import ExperimentState, replay
from gpuswarm.research.policy import Decision, decide
from gpuswarm.research.readouts import shown
from gpuswarm.research.replay import parse_spec, replay_decisions
from gpuswarm.research.settle import tsv_row

BASE = "b" * 40


def cfg(**kw: Any) -> ExperimentConfig:
    return ExperimentConfig(
        tag="t",
        branch="autoresearch/t",
        edit=["train.py"],
        command="python train.py",
        metric_pattern=metric_pattern("val_bpb"),
        **kw,
    )


class Ledger:
    """The events of one experiment, as ``ledger.jsonl`` lines."""

    def __init__(self, tmp: Path, mode: str = "async", models: dict[str, int] | None = None):
        self.paths = ExpPaths(tmp, tmp)
        self.events: list[dict[str, Any]] = []
        self.n = 0
        self.ts = 1000.0
        self.add("init", base=BASE, branch="autoresearch/t", tag="t", gpu_models=models or {})
        self.add("mode", mode=mode)

    def add(self, ev: str, **fields: Any) -> dict[str, Any]:
        self.ts += 1
        e = {"ts": self.ts, "ev": ev, **fields}
        self.events.append(e)
        return e

    def run(
        self,
        metric: float | None,
        *,
        kind: str = "variant",
        commit: str | None = None,
        origin: str | None = None,
        lines: tuple[int, int] = (1, 1),
        mb: float = 45000.0,
        on: str = "sim",
        decided: str | None = None,
        round: int = 1,
    ) -> str:
        """A run that finished with ``metric`` (None: crashed), ``lines`` = (added, removed)
        against its parent, ``mb`` peak memory, on accelerator ``on``."""
        self.n += 1
        vid = f"v{self.n:04d}"
        commit = commit or (BASE if kind == "baseline" else f"{self.n:040x}")
        self.add(
            "variant",
            id=vid,
            kind=kind,
            commit=commit,
            parent=BASE,
            description=f"idea {self.n}" if kind != "baseline" else "baseline",
            round=round,
            source="manual",
            origin=origin,
            meta={},
        )
        fin: dict[str, Any] = {
            "id": vid,
            "ok": metric is not None,
            "metric": metric,
            "memory_gb": round_gb(mb),
            "reason": None if metric is not None else "exit 1",
            "summary": {"peak_vram_mb": mb},
            "gpu": "0",
            "slot": f"h-gpu{self.n % 4}",
            "accelerator": on,
        }
        if kind != "baseline":
            fin["diff"] = {"files": 1, "insertions": lines[0], "deletions": lines[1]}
        self.add("finished", **fin)
        if decided is not None:
            value = {"commit": commit, "value": metric} if decided == "keep" else None
            self.add("decided", id=vid, status=decided, reason="", row=None, base_metric=value)
        return vid

    def baselines(self, *metrics: float, on: str = "sim") -> None:
        """Repeated baseline runs of BASE, decided (kept) as the experiment records them."""
        for m in metrics:
            vid = self.run(m, kind="baseline", on=on)
            value = {"commit": BASE, "value": self._mean_baselines()}
            self.add(
                "decided", id=vid, status="keep", reason="baseline", row=None, base_metric=value
            )

    def _mean_baselines(self) -> float:
        ids = {e["id"] for e in self.events if e["ev"] == "variant" and e["kind"] == "baseline"}
        ms = [float(e["metric"]) for e in self.events if e["ev"] == "finished" and e["id"] in ids]
        return sum(ms) / len(ms)

    def state(self) -> ExperimentState:
        self.paths.ledger.write_text("".join(json.dumps(e) + "\n" for e in self.events))
        return replay(self.paths)


def round_gb(mb: float) -> float:
    return round(mb / 1024, 1)


def one(decisions: list[Decision]) -> Decision:
    assert len(decisions) == 1, decisions
    return decisions[0]


# -- simplicity --------------------------------------------------------------------------------
def test_a_deletion_with_an_equal_metric_is_a_simplification(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    v = led.run(1.0, lines=(0, 12))
    d = one(decide(cfg(), led.state()))
    assert (d.id, d.status) == (v, "keep")
    assert d.reason.startswith("simplification: -12 lines, val_bpb equal within the noise")
    assert d.note == "simplification, -12 lines"
    # worse by more than "equal" allows (no noise estimate: equal_within 0.05%): discarded
    led = Ledger(tmp_path)
    led.baselines(1.0)
    led.run(1.001, lines=(0, 12))
    assert one(decide(cfg(), led.state())).status == "discard"
    led = Ledger(tmp_path)
    led.baselines(1.0)
    led.run(1.0004, lines=(0, 12))
    assert one(decide(cfg(), led.state())).status == "keep"  # within 0.05% of 1.0
    assert one(decide(cfg(simplify=False), led.state())).status == "discard"


def test_a_tiny_gain_for_many_added_lines_is_discarded_with_the_reason(tmp_path: Path) -> None:
    """The seed: a 0.001 improvement that adds 20 lines of hacky code? Probably not worth it."""
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    led.run(0.9992, lines=(21, 1))  # +0.0008 for +20 lines (net)
    d = one(decide(cfg(), led.state()))
    assert d.status == "discard"
    assert d.note == "+0.0008 for +20 lines"
    assert d.reason.startswith("+0.0008 for +20 lines: a change adding lines must gain 0.002 ")
    # the same gain from a one-line change, or with the rule off, is kept
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    led.run(0.9992, lines=(2, 1))
    assert one(decide(cfg(), led.state())).status == "keep"
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    led.run(0.9992, lines=(21, 1))
    assert one(decide(cfg(gain_per_line="0"), led.state())).status == "keep"
    assert one(decide(cfg(gain_per_line="0.00003"), led.state())).status == "keep"  # absolute


def test_a_gain_from_deleting_code_is_kept(tmp_path: Path) -> None:
    """The seed: a 0.001 val_bpb improvement from deleting code? Definitely keep."""
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    v = led.run(0.999, lines=(0, 20))
    assert one(decide(cfg(), led.state())) == Decision(v, "keep", "better than BASE")


# -- VRAM ----------------------------------------------------------------------------------------
def test_a_memory_blow_up_needs_a_meaningful_gain(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    led.run(0.999, mb=45000.0 * 1.5)  # +50% peak memory for +0.001 (needs 0.5%: 0.005)
    d = one(decide(cfg(), led.state()))
    assert d.status == "discard"
    assert d.reason.startswith("peak memory +50% (43.9 -> 65.9 GB) for +0.001: more than 10%")
    assert d.note == "memory +50% for +0.001"
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    led.run(0.99, mb=45000.0 * 1.5)  # a meaningful gain pays for it
    assert one(decide(cfg(), led.state())).status == "keep"
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.0)
    led.run(0.999, mb=45000.0 * 1.08)  # +8%: within the share
    assert one(decide(cfg(), led.state())).status == "keep"
    assert one(decide(cfg(vram_share=0.05), led.state())).status == "discard"


def test_memory_is_the_rows_else_the_summary_blocks(tmp_path: Path) -> None:
    """The peak a run is judged by: its row's ``memory_gb`` (printed, else measured by the VRAM
    sampler: outcome.py), else the summary block's ``peak_vram_mb``; none: not weighed."""
    for where in ("row", "summary", "none"):
        led = Ledger(tmp_path)
        led.baselines(1.0)
        led.run(0.999, mb=90000.0)
        fin = led.events[-1]
        if where != "row":
            fin["memory_gb"] = None
        if where == "none":
            fin["summary"] = {}
        d = one(decide(cfg(), led.state()))
        if where == "none":
            assert d.status == "keep", d
        else:
            assert "memory +100%" in d.note, where


# -- noise ---------------------------------------------------------------------------------------
def test_a_noisy_identical_rerun_is_not_kept(tmp_path: Path) -> None:
    """Identical code measured 1.00 and 1.02: a variant measuring 0.995 (within 2 x the spread)
    is re-run; the mean of its runs is no better than the noise: discarded, BASE stays."""
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.02)
    v = led.run(0.995)
    d = one(decide(cfg(), led.state()))
    assert (d.status, d.runs) == ("confirm", 2) and d.reason.startswith("within the noise")
    commit = f"{3:040x}"
    led.run(1.012, kind="confirm", commit=commit, origin=v)
    led.run(1.018, kind="confirm", commit=commit, origin=v)
    st = led.state()
    assert shown(st, st.variants[v])["reason"] == "confirming: 2/2 re-runs in (v0004, v0005)"
    d = one(decide(cfg(), st))
    assert d.id == v and d.status == "discard"
    assert d.reason.startswith("not confirmed: mean of 3 runs 1.008333")
    assert d.note == "not confirmed by 3 runs"
    # greedy, by choice, keeps the lucky first run at once
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.02)
    led.run(0.995)
    assert one(decide(cfg(policy="greedy"), led.state())).status == "keep"


def test_a_real_gain_within_the_noise_is_confirmed_by_its_mean(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.02)  # sd 0.01414: one run needs > 0.0283, a mean of 3 > 0.0163
    v = led.run(0.99)
    assert one(decide(cfg(), led.state())).status == "confirm"
    commit = f"{3:040x}"
    led.run(0.99, kind="confirm", commit=commit, origin=v)
    led.run(0.98, kind="confirm", commit=commit, origin=v)
    d = one(decide(cfg(), led.state()))
    assert d.status == "keep" and d.metric == pytest.approx((0.99 + 0.99 + 0.98) / 3)
    assert "confirmed, mean of 3 runs" in d.reason


def test_the_noise_estimate_pools_every_repeated_commit(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    assert rules.noise(led.state()) is None
    led.baselines(1.0, 1.02)
    v = led.run(0.9)
    led.run(0.92, kind="confirm", commit=f"{3:040x}", origin=v)
    est = rules.noise(led.state())
    assert est is not None and (est.runs, est.groups) == (4, 2)
    assert est.sigma == pytest.approx((4 * 0.01**2 / 2) ** 0.5)


def test_first_baseline_repeats() -> None:
    st = ExperimentState(gpu_models={"sim": 4})
    assert rules.auto_repeats(cfg(), st) == 2
    assert rules.auto_repeats(cfg(policy="greedy"), st) == 1
    assert rules.auto_repeats(cfg(baseline_repeats=3), st) == 3
    two = ExperimentState(gpu_models={"A100": 2, "H100": 2})
    assert rules.auto_repeats(cfg(), two) == 4
    assert rules.auto_repeats(cfg(policy="greedy"), two) == 2


# -- platforms -----------------------------------------------------------------------------------
def two_platforms(tmp: Path, mode: str = "async") -> Ledger:
    led = Ledger(tmp, mode, models={"A100": 2, "H100": 1})
    led.baselines(1.0, 1.0, on="A100")
    led.baselines(0.8, on="H100")  # the faster GPU trains further in the same time
    return led


def test_each_platform_is_compared_with_its_own_baseline(tmp_path: Path) -> None:
    led = two_platforms(tmp_path)
    worse_there = led.run(0.85, on="H100")  # far below A100's 1.0, above H100's 0.8
    st = led.state()
    d = one(decide(cfg(), st))
    assert (d.id, d.status) == (worse_there, "discard") and "0.800000" in d.reason
    assert rules.reference(st, BASE, "A100") == 1.0 and rules.reference(st, BASE, "H100") == 0.8
    assert rules.majority_platform(st) == "A100"


def test_a_win_on_the_minority_platform_moves_base_only_if_configured(tmp_path: Path) -> None:
    led = two_platforms(tmp_path)
    led.run(0.7, on="H100")
    d = one(decide(cfg(), led.state()))
    assert d.status == "discard" and "BASE moves on wins on A100 only" in d.reason
    assert d.note == "better on H100, BASE follows A100"
    assert one(decide(cfg(base_platform="any"), led.state())).status == "keep"
    assert one(decide(cfg(base_platform="H100"), led.state())).status == "keep"
    led = two_platforms(tmp_path)
    led.run(0.9, on="A100")
    assert one(decide(cfg(), led.state())).status == "keep"
    assert one(decide(cfg(base_platform="H100"), led.state())).status == "discard"


def test_a_platform_without_a_baseline_gets_one(tmp_path: Path) -> None:
    led = Ledger(tmp_path, models={"A100": 2, "H100": 1})
    led.baselines(1.0, 1.0, on="A100")  # both landed on A100s
    led.run(0.9, on="H100")
    st = led.state()
    assert decide(cfg(), st) == []  # waits for a measurement of BASE on H100
    assert rules.baseline_wanted(cfg(), st) == "H100"
    for _ in range(4):  # the extra baseline runs keep landing on A100: given up after 6 in all
        led.baselines(1.0, on="A100")
    st = led.state()
    assert rules.baseline_wanted(cfg(), st) is None
    d = one(decide(cfg(), st))
    assert d.status == "discard" and d.reason.startswith("no baseline of BASE on H100")


def keep_on_a100(led: Ledger, metric: float) -> str:
    """A kept variant on an A100: BASE moves to it (it has run on no other model)."""
    vid = led.run(metric, on="A100", decided="keep")
    led.add("base", **{"from": BASE, "to": f"{led.n:040x}", "id": vid})
    return vid


def test_after_base_moves_a_result_on_another_model_waits_for_a_run_of_it_there(
    tmp_path: Path,
) -> None:
    led = two_platforms(tmp_path)  # async: every result is judged against the current BASE
    keep_on_a100(led, 0.9)
    led.run(0.7, on="H100")  # made on the old BASE, finished after the keep
    st = led.state()
    assert decide(cfg(), st) == []
    assert rules.baseline_wanted(cfg(), st) == "H100"


def test_rounds_discard_a_result_whose_older_base_never_ran_on_its_model(tmp_path: Path) -> None:
    led = Ledger(tmp_path, "rounds", models={"A100": 2, "H100": 1})
    led.baselines(1.0, 1.0, on="A100")
    keep_on_a100(led, 0.9)
    stale = led.run(0.7, on="H100")
    led.add("sealed", n=1)
    d = one(decide(cfg(), led.state()))
    assert (d.id, d.status) == (stale, "discard")
    assert d.reason.startswith("measured on an older BASE that has no run on H100")


def test_results_rows_carry_the_platform_when_there_are_several(tmp_path: Path) -> None:
    led = two_platforms(tmp_path, mode="rounds")
    vid = led.run(0.9, on="A100")
    st = led.state()
    assert tsv_row(st, st.variants[vid], "keep")[4] == "[R1 gpu0 A100] idea 4"
    one_platform = Ledger(tmp_path, mode="rounds")
    one_platform.baselines(1.0)
    vid = one_platform.run(0.9)
    st = one_platform.state()
    assert tsv_row(st, st.variants[vid], "keep")[4] == "[R1 gpu0] idea 2"
    assert rules.short_platform("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"


def test_a_row_is_tagged_by_the_mode_its_variant_was_made_in(tmp_path: Path) -> None:
    """Issue 29, item 4: an async loop's variants that a later command decides (the loop
    ended with them in flight; the experiment's setting is rounds again) carry no round tag,
    as those the loop decided; a rounds variant keeps its tag."""
    led = Ledger(tmp_path, mode="async")
    led.baselines(1.0)
    made_async = led.run(0.9)
    led.add("mode", mode="rounds")
    made_rounds = led.run(0.9)
    st = led.state()
    assert tsv_row(st, st.variants[made_async], "keep")[4] == "[gpu0] idea 2"
    assert tsv_row(st, st.variants[made_rounds], "keep")[4] == "[R1 gpu0] idea 3"


def test_rounds_prefer_a_win_then_a_simplification(tmp_path: Path) -> None:
    led = Ledger(tmp_path, mode="rounds")
    led.baselines(1.0, 1.0)
    simpler = led.run(1.0, lines=(0, 30))
    win = led.run(0.99)
    led.add("sealed", n=1)
    got = {d.id: (d.status, d.reason) for d in decide(cfg(), led.state())}
    assert got[win][0] == "keep"
    assert got[simpler] == ("discard", "simpler, but not the best of its round")
    led = Ledger(tmp_path, mode="rounds")
    led.baselines(1.0, 1.0)
    small, big = led.run(1.0, lines=(0, 3)), led.run(1.0, lines=(2, 40))
    led.add("sealed", n=1)
    got = {d.id: (d.status, d.reason) for d in decide(cfg(), led.state())}
    assert got[big][0] == "keep" and got[small][0] == "discard"


# -- settings and the replay ---------------------------------------------------------------------
def test_amounts_are_a_share_of_base_or_metric_units() -> None:
    value, relative = rules.parse_amount("x", "0.01%")
    assert relative and value == pytest.approx(0.0001)
    assert rules.parse_amount("x", "0.0001") == (0.0001, False)
    assert rules.amount("1%", 2.5) == pytest.approx(0.025)
    for bad in ("abc", "-1", "nan%", ""):
        with pytest.raises(ValueError, match="x "):
            rules.parse_amount("x", bad)
    with pytest.raises(ValueError, match=r"gain_per_line 'lots'"):
        cfg(gain_per_line="lots")
    with pytest.raises(ValueError, match="vram_share"):
        cfg(vram_share=-0.1)


def test_replay_shows_what_another_policy_would_have_kept(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.baselines(1.0, 1.02)
    lucky = led.run(0.995)  # noise-aware (recorded): re-run, not confirmed
    led.add("decided", id=lucky, status="discard", reason="not confirmed", row=None)
    hacky = led.run(0.99, lines=(31, 1))  # +30 lines: needs a gain of about 0.003
    led.add("decided", id=hacky, status="discard", reason="within the noise", row=None)
    led.state()
    greedy = replay_decisions(led.paths, parse_spec(cfg(), "greedy"))
    # greedy keeps the lucky run at once; the next one, made on it, gains 0.005 for 30 lines
    assert greedy["would_keep"] == [lucky, hacky]
    assert greedy["best"] == 0.99
    rows = {r["id"]: r for r in greedy["variants"]}
    assert rows[lucky]["recorded"] == "discard" and rows[lucky]["replayed"] == "keep"
    strict = replay_decisions(led.paths, parse_spec(cfg(), "noise-aware,noise_confirm=0"))
    assert strict["would_keep"] == []
    assert "re-runs are off" in (
        {r["id"]: r for r in strict["variants"]}[lucky]["replayed_reason"] or ""
    )
    assert greedy["noise"][0]["runs"] == 2
    for bad, match in (("fast", "neither a policy"), ("greedy,timeout=3", "not a decision")):
        with pytest.raises(Exception, match=match):
            parse_spec(cfg(), bad)
    with pytest.raises(Exception, match="gain_per_line"):
        parse_spec(cfg(), "greedy,gain_per_line=x")
