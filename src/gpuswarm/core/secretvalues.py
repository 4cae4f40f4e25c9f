"""Where a run's secret values come from, for its one :class:`~gpuswarm.core.redact.Redactor`.

- the environment of the process that writes or shows (the supervisor for run.json, events,
  results and the report; ``status`` and the dashboard for what they show): the values of its
  secret-looking variables;
- each task's own env (added by the views that read the task);
- the files the run provisions into slot HOMEs (``home.provision``, an agent preset's login
  files): the values under secret-looking keys of a JSON file (``{"access_token": ...}``), of
  ``KEY=value`` / ``key: value`` / ``key = value`` lines, a ``.netrc``'s ``password X`` (and
  ``account X``), and a file that is one word (a token file such as
  ``~/.cache/huggingface/token``).

A provisioned file is read with limits: regular files only (a link is not followed), at most
``FILE_MAX`` bytes each and ``FILES_MAX`` files per run; what cannot be read is skipped (the
supervisor reports unreadable provisions itself). Values are cached per file by its size and
modification time, so a view that builds a redactor every second reads each file once.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuswarm.core.redact import Redactor, env_secret_values, is_secret_name

FILE_MAX = 256 * 1024
FILES_MAX = 200
DEPTH_MAX = 6
TOKEN_FILE = re.compile(r"\S{8,4096}")
_LINE_PAIR = re.compile(
    r"""(?m)^[ \t]*(?:export[ \t]+)?["']?([A-Za-z_][A-Za-z0-9_.\-]*)["']?[ \t]*[:=][ \t]*"""
    r"""(?:"([^"\n]*)"|'([^'\n]*)'|([^\s#'"][^\n]*?))[ \t]*,?[ \t]*$"""
)

_NETRC = re.compile(r"(?:^|\s)(?:password|account)\s+(\S+)")  # a .netrc: words, not pairs


def _key_secret(key: str) -> bool:
    return is_secret_name(key.replace("-", "_").replace(".", "_"))


def _json_values(value: Any, secret: bool = False, depth: int = 0) -> Iterator[str]:
    if depth > 64:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_values(v, secret or (isinstance(k, str) and _key_secret(k)), depth + 1)
    elif isinstance(value, list):
        for v in value:
            yield from _json_values(v, secret, depth + 1)
    elif secret and isinstance(value, str):  # {"expires_in": 3600} under "oauth": no secret
        yield value


def values_in_text(text: str) -> set[str]:
    """The secret values one provisioned file holds (see the module doc)."""
    stripped = text.strip()
    if TOKEN_FILE.fullmatch(stripped):
        return {stripped}
    found: set[str] = set()
    if stripped[:1] in "{[":
        with contextlib.suppress(ValueError, RecursionError):  # not JSON: the lines below
            found.update(_json_values(json.loads(stripped)))
    for m in _LINE_PAIR.finditer(text):
        if _key_secret(m.group(1)):
            found.add(next(g for g in m.groups()[1:] if g is not None))
    if "machine" in text or "default" in text:
        found.update(m.group(1) for m in _NETRC.finditer(text))
    return found


@functools.lru_cache(maxsize=512)
def _file_values(path: str, size: int, mtime_ns: int) -> frozenset[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return frozenset()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return frozenset()
        data = os.read(fd, FILE_MAX + 1)
    except OSError:
        return frozenset()
    finally:
        os.close(fd)
    if len(data) > FILE_MAX or b"\0" in data:
        return frozenset()
    return frozenset(values_in_text(data.decode("utf-8", "replace")))


def _files(src: Path) -> Iterator[Path]:
    """Regular files under ``src`` (itself, or a folder walked without following links)."""
    try:
        st = os.lstat(src)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        yield src
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    base = len(src.parts)
    for folder, dirs, names in os.walk(src, followlinks=False):
        if len(Path(folder).parts) - base >= DEPTH_MAX:
            dirs.clear()
        for name in sorted(names):
            yield Path(folder) / name


def provisioned_values(sources: Iterable[str | Path]) -> set[str]:
    """The secret values in the provisioned files ``sources`` (files or folders)."""
    found: set[str] = set()
    count = 0
    for src in sources:
        for path in _files(Path(src).expanduser()):
            count += 1
            if count > FILES_MAX:
                return found
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size <= FILE_MAX:
                found |= _file_values(str(path), st.st_size, st.st_mtime_ns)
    return found


def provision_sources(*holders: Mapping[str, Any] | None, base: str | None = None) -> list[Path]:
    """``home.provision[].src`` of run.json and of its ``config`` (relative ones under the
    run's base folder)."""
    out: list[Path] = []
    for holder in holders:
        home = holder.get("home") if isinstance(holder, Mapping) else None
        entries = home.get("provision") if isinstance(home, dict) else None
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, dict) and isinstance(e.get("src"), str) and e["src"]:
                src = Path(e["src"]).expanduser()
                out.append(src if src.is_absolute() or not base else Path(base) / src)
    return list(dict.fromkeys(out))


def env_values_in(config: Any, depth: int = 0) -> set[str]:
    """Secret values of every ``env`` mapping in a config dump (defaults, tasks, matrices)."""
    found: set[str] = set()
    if depth > 32:
        return found
    if isinstance(config, dict):
        for k, v in config.items():
            if k == "env" and isinstance(v, dict):
                found |= env_secret_values(v)
            else:
                found |= env_values_in(v, depth + 1)
    elif isinstance(config, list):
        for v in config:
            found |= env_values_in(v, depth + 1)
    return found


def run_redactor(
    info: Mapping[str, Any] | None = None,
    *envs: Mapping[str, Any] | None,
    config: Mapping[str, Any] | None = None,
    base_dir: str | Path | None = None,
) -> Redactor:
    """The redactor of a run: this process's environment, the files the run provisions (from
    run.json's ``info`` or the raw ``config``), every env of ``config``, and ``envs``."""
    info = info if isinstance(info, Mapping) else {}
    cfg = config if config is not None else info.get("config")
    base = base_dir if base_dir is not None else info.get("base_dir")
    sources = provision_sources(
        info, cfg if isinstance(cfg, Mapping) else None, base=str(base) if base else None
    )
    values = env_secret_values(os.environ) | provisioned_values(sources)
    if config is not None:
        values |= env_values_in(config)
    return Redactor(values).including(*envs)
