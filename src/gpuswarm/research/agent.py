"""The ``agent`` proposer: runs an LLM coding agent's CLI in a scratch export of BASE with a prompt
file (the user's program.md, the current best, recent results and crashes); its edits of the
editable files and its message become the variant. The CLI is a preset (``--agent claude-code``,
:mod:`gpuswarm.agents`: its non-interactive argv, the prompt on stdin, as an argument or a file,
its variables, checked installed and logged in before the loop starts; the message is the first
line of its answer) or a command of the user's (``--agent-command``: the message is
``$GPUSWARM_MESSAGE_FILE``, else the last line it printed). A timeout per proposal; a cap on
consecutive failures; an agent dies with the loop that started it (PR_SET_PDEATHSIG), so a
killed loop leaves none spending tokens.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuswarm.agents.command import answer_line, invocation, preflight_script
from gpuswarm.agents.preset import AgentPreset, AgentUse
from gpuswarm.app import api
from gpuswarm.core.errors import ConfigError, ResearchError
from gpuswarm.core.placeholders import render
from gpuswarm.core.redact import name_redactor
from gpuswarm.research import gitops
from gpuswarm.research.experiment import ExperimentConfig, ExpPaths
from gpuswarm.research.exports import remove_tree
from gpuswarm.research.journal import ExperimentState, append
from gpuswarm.research.proposercost import usage_meta
from gpuswarm.research.proposers import Proposal
from gpuswarm.research.spend import ProposerSpend


@dataclass(frozen=True)
class AgentOptions:
    command: str = ""  # e.g. "claude -p \"$(cat {prompt})\"" with --shell, or an argv string
    program: Path | None = None  # the user's program.md
    timeout: float = 900.0
    max_failures: int = 5
    shell: bool = False
    preset: AgentPreset | None = None  # --agent NAME: instead of command
    budget_usd: float | None = None  # issue 34: the proposals' cost that ends the loop
    budget_tokens: int | None = None  # issue 34: the proposals' tokens (in + out) that end it


PREFLIGHT_TIMEOUT = 120.0


def load_preset(name: str, *, model: str | None = None, effort: str | None = None) -> AgentPreset:
    """``--agent``: a shipped preset's name, or a YAML file of an ``agent:`` mapping (a preset
    and the fields it overrides, or ``preset: custom`` with a program and its args)."""
    data: dict[str, Any] = {"preset": name}
    if name.endswith((".yaml", ".yml")) or "/" in name:
        path = Path(name).expanduser()
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ResearchError(f"--agent {name}: cannot read it as YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ResearchError(f"--agent {name}: expected a mapping of preset fields")
        data = loaded
    if model is not None:
        data["model"] = model
    if effort is not None:
        data["effort"] = effort
    try:
        use = AgentUse.model_validate(data)
        for field in ("prompt", "prompt_file", "workdir", "copy_from", "files"):
            if field in use.model_fields_set:
                raise ResearchError(f"--agent {name}: {field} is for batch tasks; remove it")
        return use.resolved()
    except ValidationError as exc:
        msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ResearchError(f"--agent {name}: {msg}") from None
    except ConfigError as exc:
        raise ResearchError(str(exc)) from None


def check_agent(preset: AgentPreset) -> str:
    """Is the preset's CLI installed and logged in? Its report, or a ResearchError (exit 2)
    with what is missing, before the loop starts anything."""
    try:
        proc = subprocess.run(
            ["/bin/sh", "-c", preflight_script(preset)],
            env={**_clean_env(), **preset.env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PREFLIGHT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ResearchError(
            f"agent {preset.preset}: its login check ran past {PREFLIGHT_TIMEOUT:g}s"
        ) from None
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise ResearchError(f"agent {preset.preset} is not ready:\n{out}")
    return out


class AgentProposer:
    name = "agent"

    def __init__(self, paths: ExpPaths, cfg: ExperimentConfig, opts: AgentOptions) -> None:
        self.paths = paths
        self.cfg = cfg
        self.opts = opts
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._numbers = itertools.count(1 + len(list(paths.prompts.glob("prompt-*.md"))))
        self._live: set[subprocess.Popen[bytes]] = set()
        self._closed = False
        self.spend = ProposerSpend(paths, opts.budget_usd, opts.budget_tokens)  # issue 34
        remove_stale_scratch(paths)

    def close(self) -> None:
        """Stop agents still running (the loop ends)."""
        with self._lock:
            self._closed = True
            live = list(self._live)
        if live:
            api.kill_tree([p.pid for p in live], 2.0)

    def propose(self, state: ExperimentState) -> Proposal | None:
        """Ask the agent until it makes a usable edit; after ``max_failures`` in a row, stop."""
        while True:
            self.spend.check()  # issue 34: --budget-usd spent: no more proposals
            try:
                proposal = self._run(state)
            except _AgentFailed as exc:
                with self._lock:
                    if self._closed:
                        return None
                    self.failures += 1
                    self.last_error = str(exc)
                    failures = self.failures
                append(
                    self.paths, "proposal", proposer=self.name, outcome="failed", reason=str(exc),
                    **self.spend.last(),
                )  # fmt: skip
                if failures >= self.opts.max_failures:
                    raise ResearchError(
                        f"the agent failed {self.failures} times in a row (last: "
                        f"{self.last_error}); fix --agent-command, then run `research loop` again"
                    ) from None
                continue
            self.failures = 0
            usage = self.spend.last()  # issue 34: what this proposal's agent spent
            proposal.meta.update(usage_meta(usage))  # its variant's results.tsv columns
            append(
                self.paths,
                "proposal",
                proposer=self.name,
                outcome="made",
                prompt=proposal.meta.get("prompt"),
                description=proposal.description,
                **usage,
            )
            return proposal

    def _run(self, state: ExperimentState) -> Proposal:
        self.paths.prompts.mkdir(exist_ok=True)
        with self._lock:
            n = next(self._numbers)
        prompt = self.paths.prompts / f"prompt-{n:04d}.md"
        prompt.write_text(self.prompt_text(state))
        with scratch_dir(self.paths, n) as tmp:
            work = tmp / "work"
            gitops.export(self.paths.repo, state.base, work)
            link_into(self.paths, self.cfg, work)  # .venv, data: the agent can smoke-test
            message_file = tmp / "message.txt"
            out, answer = self._call(work, prompt, message_file)
            files = {}
            for rel in self.cfg.edit:
                try:
                    data: bytes | None = (work / rel).read_bytes()
                except FileNotFoundError:
                    data = None
                if data != gitops.blob(self.paths.repo, state.base, rel):
                    files[rel] = data
            if not files:
                raise _AgentFailed(f"the agent changed none of {', '.join(self.cfg.edit)}")
            message = message_file.read_text().strip() if message_file.exists() else ""
        # a message file is a commit message: its first line is the description; else a
        # preset's answer line; else the last line the agent printed (its chatter comes before)
        lines = [ln.strip() for ln in (message or out).splitlines() if ln.strip()]
        if message and lines:
            pick = lines[0]
        elif answer:
            pick = answer
        else:
            pick = lines[-1] if lines else "agent edit"
        message = name_redactor().name(pick[:200])  # it may echo a secret it was shown
        return Proposal(files, message, state.base, {"prompt": n})

    def _argv(
        self, work: Path, prompt: Path
    ) -> tuple[list[str] | str, Path | None, dict[str, str]]:
        """What to run: the preset's invocation, or the user's command rendered."""
        preset = self.opts.preset
        if preset is not None:
            inv = invocation(preset, workdir=work, prompt_file=prompt, files=self.cfg.edit)
            return inv.argv, inv.stdin, inv.env
        values = {"prompt": str(prompt), "workdir": str(work)}
        if self.opts.shell:
            values = {k: shlex.quote(v) for k, v in values.items()}
        text = render(self.opts.command, values)
        return (text if self.opts.shell else shlex.split(text)), None, {}

    def _call(self, work: Path, prompt: Path, message_file: Path) -> tuple[str, str]:
        """Run the agent; (everything it printed, its answer line: presets only)."""
        argv, stdin_file, own_env = self._argv(work, prompt)
        env = {
            **_clean_env(),
            **own_env,
            "GPUSWARM_PROMPT_FILE": str(prompt),
            "GPUSWARM_MESSAGE_FILE": str(message_file),
            "GPUSWARM_EDIT": " ".join(self.cfg.edit),
        }
        with contextlib.ExitStack() as stack:
            stdin = stack.enter_context(stdin_file.open("rb")) if stdin_file else None
            proc = self._start(argv, work, env, stdin)
            with self._lock:
                self._live.add(proc)
            try:
                out, err = proc.communicate(timeout=self.opts.timeout)
            except subprocess.TimeoutExpired:
                api.kill_tree([proc.pid], 5.0)
                proc.communicate()
                raise _AgentFailed(f"the agent ran past {self.opts.timeout:g}s") from None
            finally:
                with self._lock:
                    self._live.discard(proc)
        text_out = out.decode("utf-8", errors="replace")
        text_all = text_out + (err or b"").decode("utf-8", errors="replace")
        self.spend.add(self.opts.preset, text_out)  # issue 34: its tokens and cost
        if proc.returncode != 0:
            tail = text_all.strip().splitlines()[-1:] or [""]
            raise _AgentFailed(f"the agent exited {proc.returncode}: {tail[0][:200]}")
        preset = self.opts.preset
        return text_all, answer_line(preset, text_out) if preset is not None else ""

    def _start(
        self, argv: list[str] | str, work: Path, env: dict[str, str], stdin: Any
    ) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                argv,
                cwd=work,
                env=env,
                shell=self.opts.shell and self.opts.preset is None,
                stdin=stdin if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                # a preset's answer is its standard output; a command's chatter is all of it
                stderr=subprocess.PIPE if self.opts.preset is not None else subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # a killed loop leaves no agent spending tokens
            )
        except OSError as exc:
            raise _AgentFailed(f"cannot start the agent: {exc}") from None

    def prompt_text(self, state: ExperimentState, recent: int = 30) -> str:
        cfg = self.cfg
        program = ""
        if self.opts.program is not None:
            program = self.opts.program.read_text()
        best = "-" if state.best is None else f"{state.best:.6f}"
        rows = "\n".join("\t".join(r) for r in state.rows[-recent:])
        crashes = [
            f"- {v.id} {v.description}: {v.finished.get('reason')}\n{v.finished.get('tail', '')}"
            for v in list(state.variants.values())[-recent:]
            if v.finished is not None and not v.finished.get("ok")
        ]
        goal = "lowest" if cfg.goal == "min" else "highest"
        return "\n".join(
            [
                program,
                "",
                "## Your task now",
                f"Make ONE change to {', '.join(cfg.edit)} in the current folder that you expect "
                f"to give the {goal} {cfg.metric}. Change no other file"
                + (f" (never {', '.join(cfg.protect)})" if cfg.protect else "")
                + ". Do not run the training; gpuswarm runs it on a GPU.",
                "Describe the change in one line: begin your final answer with it (or write "
                "it to the file named by $GPUSWARM_MESSAGE_FILE).",
                "",
                f"Current BASE: {gitops.short(state.base)}; best {cfg.metric}: {best}",
                "",
                "## Recent results (results.tsv)",
                rows or "(none yet)",
                "",
                "## Recent crashes",
                "\n".join(crashes) or "(none)",
                "",
            ]
        )


class _AgentFailed(Exception):
    pass


SCRATCH = "scratch"


@contextlib.contextmanager
def scratch_dir(paths: ExpPaths, n: int) -> Iterator[Path]:
    """``<experiment>/scratch/agent-<pid>-<n>/``: removed after the proposal, and by the next
    loop when the process that made it was killed."""
    root = paths.root / SCRATCH
    root.mkdir(exist_ok=True)
    tmp = root / f"agent-{os.getpid()}-{n:04d}"
    remove_tree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        remove_tree(tmp)


def remove_stale_scratch(paths: ExpPaths) -> None:
    """Scratch folders of proposers whose process is gone (a loop killed with SIGKILL)."""
    root = paths.root / SCRATCH
    if not root.is_dir():
        return
    for entry in root.iterdir():
        parts = entry.name.split("-")
        pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0
        if pid != os.getpid() and not _alive(pid):
            remove_tree(entry)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def link_into(paths: ExpPaths, cfg: ExperimentConfig, work: Path) -> None:
    """The experiment's --link paths (``.venv``, data) as symlinks in a scratch copy."""
    for rel in cfg.link:
        src = paths.repo / rel
        if src.exists() and not (work / rel).exists():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).symlink_to(src)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """PR_SET_PDEATHSIG: the agent gets SIGKILL when the loop (the thread that started it)
    dies, even by SIGKILL."""
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _prctl() -> Any:
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        return lambda *args: 0
    ulong = ctypes.c_ulong
    fn.argtypes = [ctypes.c_int, ulong, ulong, ulong, ulong]
    fn.restype = ctypes.c_int
    return fn


_PR_SET_PDEATHSIG = 1
_PRCTL = _prctl()  # looked up before any fork: the child only calls it


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("GPUSWARM_RUN_DIR", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(name, None)
    return env


def which(command: str) -> bool:
    words = shlex.split(command)
    return bool(words) and shutil.which(words[0]) is not None
