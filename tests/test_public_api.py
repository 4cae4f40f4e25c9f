"""The facade's public name (``from gpuswarm import api``) is :mod:`gpuswarm.app.api` itself
(issue 32: the facade moved into app/; clients keep importing it by its old name)."""

from __future__ import annotations

import subprocess
import sys

import gpuswarm.app.api


def test_the_public_name_is_the_facade_itself() -> None:
    from gpuswarm import api  # rewrite: keep

    assert api is gpuswarm.app.api
    assert api.create_run is gpuswarm.app.api.create_run


def test_a_fresh_process_imports_it_by_either_name() -> None:
    snippet = (
        "import gpuswarm.api as a, gpuswarm.app.api as b;"  # rewrite: keep
        "print(a is b, sorted(set(b.__all__) - set(dir(a))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "[]"]
