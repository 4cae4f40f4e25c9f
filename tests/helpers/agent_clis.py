"""Where the real agent CLIs of the end-to-end tests are, and what to do when one is missing.

``.ci/run`` installs them (``install_agent_clis``) into ``$GPUSWARM_AGENT_CLIS`` (default
``~/.cache/gpuswarm-ci/agents``): Claude Code, Codex and Gemini CLI from npm under ``npm/``
(``npm/bin/claude``, ``npm/bin/codex``, ``npm/bin/gemini``) and
aider from PyPI into its own virtualenv ``aider/`` (``aider/bin/aider``), so aider's pinned
dependencies never touch the test environment. A CLI on PATH counts too.

:func:`require_cli` skips a test when its CLI is missing, and fails it instead under CI
(``CI=true``) or ``GPUSWARM_REQUIRE_AGENTS=1``: a CI run without the CLIs must not pass by
skipping the only tests that drive them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REQUIRE_ENV = "GPUSWARM_REQUIRE_AGENTS"
PLACES = {
    "claude": "npm/bin/claude",
    "codex": "npm/bin/codex",
    "gemini": "npm/bin/gemini",
    "aider": "aider/bin/aider",
}
INSTALL = {
    "claude": "npm install -g --prefix <dir>/npm @anthropic-ai/claude-code",
    "codex": "npm install -g --prefix <dir>/npm @openai/codex",
    "gemini": "npm install -g --prefix <dir>/npm @google/gemini-cli",
    "aider": "a virtualenv <dir>/aider with aider-chat installed",
}

# no update checks, telemetry or error reports (there is no network here)
QUIET_ENV = {
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "AIDER_CHECK_UPDATE": "false",
    "AIDER_ANALYTICS": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}


def clis_dir() -> Path:
    default = Path("~/.cache/gpuswarm-ci/agents").expanduser()
    return Path(os.environ.get("GPUSWARM_AGENT_CLIS") or default)


def agents_required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get(REQUIRE_ENV) == "1"


def find_cli(name: str) -> Path | None:
    installed = clis_dir() / PLACES[name]
    if os.access(installed, os.X_OK):
        return installed
    found = shutil.which(name)
    return Path(found) if found else None


def require_cli(name: str) -> Path:
    path = find_cli(name)
    if path is not None:
        return path
    message = (
        f"the {name} CLI is not installed (looked in {clis_dir() / PLACES[name]} and on PATH); "
        f".ci/run installs it: {INSTALL[name]}"
    )
    if agents_required():
        pytest.fail(message)
    pytest.skip(message)
