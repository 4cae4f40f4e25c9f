"""A proposal made from an older BASE never writes old contents over what was kept since."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuswarm.core.errors import ResearchError
from gpuswarm.research import configure as configure
from gpuswarm.research import runner as runner
from gpuswarm.research import session as session

TRAIN = "LR = 0.04\n# spacer\nDEPTH = 8\n# spacer\nWD = 0.1\nprint('val_bpb: 1.0')\n"


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def exp(tmp_path: Path) -> session.Experiment:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "master")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "train.py").write_text(TRAIN)
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "init")
    opts = configure.InitOptions(
        tag="t", edit=["train.py"], command="true", protect=[], gpus="sim:1", linger=0.5
    )
    configure.init(repo, opts)
    return session.Experiment.open(repo, "t")


def _advance_base(exp: session.Experiment, text: str) -> str:
    """Move the experiment's branch forward (as a keep would), outside the proposal's view."""
    repo = exp.paths.repo
    (repo / "train.py").write_text(text)
    git(repo, "commit", "-q", "-am", "kept meanwhile")
    return git(repo, "rev-parse", "HEAD")


def test_a_stale_proposal_is_rebased_onto_the_new_base(exp: session.Experiment) -> None:
    old = exp.settle().base
    new = _advance_base(exp, TRAIN.replace("DEPTH = 8", "DEPTH = 6"))
    proposal = TRAIN.replace("LR = 0.04", "LR = 0.05").encode()  # made from the old BASE
    try:
        data = session.try_variant(exp, "LR 0.05", files={"train.py": proposal}, base=old)
        assert data["parent"] == new
        text = git(exp.paths.repo, "show", f"{data['commit']}:train.py")
        assert "LR = 0.05" in text and "DEPTH = 6" in text  # the kept change survives
    finally:
        runner.stop_runner(exp.paths, grace=5)


def test_a_stale_proposal_that_conflicts_is_refused(exp: session.Experiment) -> None:
    old = exp.settle().base
    _advance_base(exp, TRAIN.replace("LR = 0.04", "LR = 0.03"))
    proposal = TRAIN.replace("LR = 0.04", "LR = 0.05").encode()
    with pytest.raises(ResearchError, match="conflicts with what was kept"):
        session.try_variant(exp, "LR 0.05", files={"train.py": proposal}, base=old)
    assert all(v.kind == "baseline" for v in exp.settle().variants.values())


def test_a_variant_s_description_is_redacted_before_it_is_written(
    exp: session.Experiment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proposer's (an agent's) description echoing a secret of this process: the variant's
    description (state, results.tsv, the report, the dashboard) and its commit hold ***."""
    monkeypatch.setenv("RESEARCH_API_TOKEN", "rs-secret-8642")
    proposal = TRAIN.replace("LR = 0.04", "LR = 0.06").encode()
    try:
        data = session.try_variant(
            exp, "LR 0.06 (key rs-secret-8642)", files={"train.py": proposal}
        )
        assert exp.settle().variants[data["id"]].description == "LR 0.06 (key ***)"
        message = git(exp.paths.repo, "log", "-1", "--format=%B", data["commit"])
        assert "rs-secret-8642" not in message
        written = [p for p in exp.paths.root.rglob("*") if p.is_file()]
        assert written and not [p for p in written if b"rs-secret-8642" in p.read_bytes()]
    finally:
        runner.stop_runner(exp.paths, grace=5)
