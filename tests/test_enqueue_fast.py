"""The enqueue's fast paths give exactly what the long way gives (issue 31).

A command list's descriptors are filled into one encoded template and its fingerprint hashes the
same template's sorted text: both must be byte for byte what encoding each task's dict gives, for
any command (quotes, unicode, placeholders, --no-shell argument lists) and any shared options.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuswarm.app.setup import queued
from gpuswarm.config.commands import task_dumps, tasks_digest
from gpuswarm.config.load import load_command_list
from gpuswarm.config.models import TaskOptions
from gpuswarm.core.fsutil import COMPACT, dumps_compact
from gpuswarm.core.jsontemplate import JsonTemplate, TemplateError, hole
from gpuswarm.core.models import Descriptor
from gpuswarm.store.staging import Encoded
from gpuswarm.supervise.preflight import _first_words, missing_programs

LINES = [
    'echo "héllo wörld" {config_dir}',
    "true",
    'printf \'%s\\n\' "a\\"b"',
    "python train.py --lr 0.1 --seed {#}",
    "false ☃ \\u0000 \t tab",
    "x" * 300,
]

OPTIONS = [
    TaskOptions(),
    TaskOptions(priority=7, env={"MODE": "é", "TOKEN_FILE": "/tmp/t"}, max_attempts=3),
    TaskOptions(timeout=12.5, gpus=2, cwd="sub"),
]


def _long_way(loaded_tasks: object) -> list[bytes]:
    return [dumps_compact(Descriptor.new(d, i).raw) for i, d in enumerate(task_dumps(loaded_tasks))]  # type: ignore[arg-type]


@pytest.mark.parametrize("shell", [True, False])
@pytest.mark.parametrize("opts", OPTIONS)
def test_encoded_descriptors_are_the_long_ways_bytes(
    tmp_path: Path, shell: bool, opts: TaskOptions
) -> None:
    text = "\n".join(LINES * 3) + "\n"
    loaded = load_command_list(None, text, base_dir=tmp_path, shell=shell, defaults=opts)
    got = list(queued(loaded))
    assert all(isinstance(e, Encoded) for e in got)
    assert [e.blob for e in got if isinstance(e, Encoded)] == _long_way(loaded.tasks)
    assert [e.seq for e in got if isinstance(e, Encoded)] == list(range(len(got)))
    assert {e.priority for e in got if isinstance(e, Encoded)} == {opts.priority or 0}


def _digest_long_way(loaded_tasks: object, layout: dict[str, object]) -> str:
    dumps = sorted(task_dumps(loaded_tasks), key=lambda t: str(t["id"]))  # type: ignore[arg-type]
    blob = json.dumps(
        {**layout, "tasks": dumps}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@pytest.mark.parametrize("shell", [True, False])
def test_fingerprint_is_the_long_ways(tmp_path: Path, shell: bool) -> None:
    text = "\n".join(LINES * 40) + "\n"  # ids cmd-00001..: sorted order differs from line order
    loaded = load_command_list(None, text, base_dir=tmp_path, shell=shell, defaults=OPTIONS[1])
    layout: dict[str, object] = {"gpus_per_task": 1, "home": None}
    assert tasks_digest(loaded.tasks, layout) == _digest_long_way(loaded.tasks, layout)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=20).filter(lambda s: s.strip()), min_size=1, max_size=5)
)
def test_template_fills_any_text(values: list[str]) -> None:
    obj = {"a": hole(0), "b": [1, {"c": hole(1)}], "id": hole(0), "n": hole(2), "v": hole(3)}
    spaced = functools.partial(json.dumps, ensure_ascii=False)  # ", " between list items
    encoders: list[tuple[Callable[[Any], str], bool]] = [(COMPACT.encode, True), (spaced, False)]
    rows: list[tuple[Any, ...]] = [
        (values[0], values[-1], len(values), values),  # an argv: joined by the template
        (values[0], values[-1], values, [1, *values, None]),  # not all strings: the encoder's
    ]
    for row in rows:
        filled = {"a": row[0], "b": [1, {"c": row[1]}], "id": row[0], "n": row[2], "v": row[3]}
        for dumps, ascii_ in encoders:
            template = JsonTemplate(obj, (2, 1, 1, 1), dumps, ensure_ascii=ascii_)
            assert template.fill(row) == dumps(filled)


def test_a_value_that_looks_like_a_hole_is_refused() -> None:
    with pytest.raises(TemplateError):
        JsonTemplate({"a": hole(0), "b": hole(0)}, (1,), COMPACT.encode)
    with pytest.raises(TemplateError):  # inside a longer string: not a hole, and not allowed
        JsonTemplate({"a": hole(0), "b": "x" + hole(0)}, (1,), COMPACT.encode)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab =\t\n\r\x0b\x0c\x1c'\"\\#;|$x{}é", max_size=10))
def test_first_word_is_shlexs(command: str) -> None:
    try:
        expected: list[str] | None = shlex.split(command, comments=True)[:1]
    except ValueError:
        expected = None
    assert _first_words(command) == expected


@pytest.mark.parametrize("shell", [True, False])
def test_missing_programs_of_a_command_list_are_the_long_ways(tmp_path: Path, shell: bool) -> None:
    lines = [*LINES, "no-such-prog-gs a", "no-such-prog-gs b", "./missing.sh", "A=1 x", "$HOME/x"]
    text = "\n".join(lines * 3) + "\n"
    loaded = load_command_list(None, text, base_dir=tmp_path, shell=shell, defaults=OPTIONS[2])
    as_list = [loaded.tasks[i] for i in range(len(loaded.tasks))]  # TaskSpecs: the long way
    got = missing_programs(loaded.tasks, tmp_path)
    assert got == missing_programs(as_list, tmp_path)
    assert got[0]["no-such-prog-gs"] == 6
