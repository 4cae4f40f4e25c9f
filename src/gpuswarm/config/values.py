"""The value types of the config models (durations, timeouts, env names and values, metric
regexes, paths inside the workspace or the private HOME, non-empty strings), each a str/float
with a validator whose ``ValueError`` says what is wrong and how to fix it. ``parse_duration`` is
also what every duration flag of the CLI uses."""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

from gpuswarm.config.yamlload import quote, shorten
from gpuswarm.core.placeholders import CONFIG_REF

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # env names, matrix keys

DURATION_HELP = "write seconds (600) or 90s, 10m, 2h, 1h30m"
MAX_DURATION_SECONDS = 365 * 86400.0  # longer is a typo, not a plan (and overflows timers)
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([dhms])")
_NUMBER = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*$")


# -- durations -------------------------------------------------------------------------------------
def _parse_units(text: str) -> float | None:
    total, pos, last_rank = 0.0, 0, -1
    for match in _DURATION_PART.finditer(text):
        rank = "dhms".index(match.group(2))
        if match.start() != pos or rank <= last_rank:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos, last_rank = match.end(), rank
    return total if pos and text[pos:].strip() == "" else None


def parse_duration(value: object) -> float:
    """Seconds from ``600``, ``2.5``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1h30m"``, ``"1.5h"``.

    ``"2d"`` (days) works too.

    Raises ``ValueError`` (with the fix) for anything else, and for values that are not > 0.
    """
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and len(value) <= 64:  # longer is no duration (and scans slowly)
        number = _NUMBER.match(value)
        seconds = float(number.group(1)) if number else _parse_units(value.strip())
    if seconds is None or math.isnan(seconds):
        raise ValueError(f"{quote(value)} is not a duration; {DURATION_HELP}")
    if seconds <= 0 or math.isinf(seconds):
        raise ValueError(f"{quote(value)} is not a positive duration; {DURATION_HELP}")
    if seconds > MAX_DURATION_SECONDS:
        raise ValueError(f"{quote(value)} is longer than 365 days; write at most 365d (or 8760h)")
    return seconds


def _timeout(value: object) -> float | str | None:
    if value is None:
        return None
    ref = CONFIG_REF.fullmatch(value.strip()) if isinstance(value, str) else None
    if ref is not None:  # a glob task's ``{config.field}``: resolved per matched file
        if ref.group(2) is not None:  # its fallback must be a duration too: checked now
            try:
                parse_duration(ref.group(2))
            except ValueError as exc:
                raise ValueError(f"the fallback of {ref.group(0)}: {exc}") from None
        return ref.group(0)
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{exc}; or null for no timeout") from None


Duration = Annotated[float, BeforeValidator(parse_duration)]
Timeout = Annotated[float | str | None, BeforeValidator(_timeout)]


# -- env, metrics, paths ---------------------------------------------------------------------------
def _env_name(name: str) -> str:
    if not IDENT.match(name):
        raise ValueError(
            f"{quote(name)} is not a valid environment variable name; use letters, digits and '_', "
            "not starting with a digit"
        )
    return name


def _env_value(value: object) -> str:
    # Never echo the value: it may be a secret.
    if isinstance(value, bool) or value is None:
        shown = "null" if value is None else str(value).lower()
        raise ValueError(f"the value is {shown}, not a string; quote it, e.g. '1', 'true' or ''")
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError("the value contains a NUL byte, which no environment can hold")
        return value
    raise ValueError("the value must be a string (or a number); quote it")


EnvName = Annotated[str, AfterValidator(_env_name)]
EnvValue = Annotated[str, BeforeValidator(_env_value)]


def _metric_pattern(pattern: str) -> str:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(
            f"pattern '{shorten(pattern)}' is not a valid regular expression ({exc}); "
            "escape special characters with a backslash"
        ) from None
    if compiled.groups != 1:
        raise ValueError(
            f"pattern '{shorten(pattern)}' has {compiled.groups} capture groups; it needs exactly "
            "one, "
            r"around the value, e.g. 'loss=([0-9.]+)' (write (?:...) for other groups)"
        )
    return pattern


MetricPattern = Annotated[str, AfterValidator(_metric_pattern)]


def _relative_to(text: str, where: str, example: str) -> str:
    path = PurePosixPath(text)
    if not text.strip() or path.is_absolute() or text.startswith("~") or ".." in path.parts:
        raise ValueError(
            f"{quote(text)} must be a relative path inside {where}, like {example}; "
            "it cannot be empty or absolute or use '..'"
        )
    return text


def _in_workspace(text: str) -> str:
    return _relative_to(text, "the task workspace", "task_result.yaml")


def _in_home(text: str) -> str:
    return _relative_to(text, "the slot's HOME", ".codex/auth.json")


RelativePath = Annotated[str, AfterValidator(_in_workspace)]
HomePath = Annotated[str, AfterValidator(_in_home)]


def expand_user(text: str | PurePosixPath | Path) -> Path:
    """``Path(text).expanduser()``; ValueError (with the fix) for ``~nosuchuser``."""
    try:
        return Path(text).expanduser()
    except RuntimeError:  # pathlib: "Could not determine home directory."
        user = str(text).split("/", 1)[0]
        raise ValueError(
            f"{quote(user)}: no such user on this machine, so it cannot be expanded; write the "
            "full path, or ~/ for your own home"
        ) from None


def _non_empty(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text


NonEmpty = Annotated[str, AfterValidator(_non_empty)]


# -- sizes: names, commands, folders (issue 30) ---------------------------------------------------
MAX_NAME_BYTES = 512  # a task's name: written in every event, result row, run.json and report
MAX_ARG_BYTES = 131_071  # one command string or argument: Linux's MAX_ARG_STRLEN, less its NUL
MAX_ARGV_BYTES = 1 << 20  # a whole argv list (ARG_MAX, 2 MiB here, holds the environment too)
MAX_FOLDER_NAME_BYTES = 255  # one name in a path (NAME_MAX of every common file system)
MAX_WORKSPACE_BYTES = 3072  # PATH_MAX is 4096: room for <name>/run_<ts>/tasks/<id>/attempt_<n>


def byte_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a lone surrogate counts as its 3 bytes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def check_name_size(name: str, what: str = "the name") -> str:
    """``name`` if a task can carry it, else ValueError naming the limit."""
    size = byte_size(name)
    if size > MAX_NAME_BYTES:
        raise ValueError(
            f"{what} is {size:,} bytes long; a task name can be at most {MAX_NAME_BYTES} bytes "
            "(it is written in every event, result row and report): shorten it"
        )
    return name


def _argument_size(text: str, what: str) -> int:
    size = byte_size(text)
    if size > MAX_ARG_BYTES:
        raise ValueError(
            f"{what} is {size:,} bytes long; one command (or argument) can be at most "
            f"{MAX_ARG_BYTES:,} bytes (Linux's limit on one argument, MAX_ARG_STRLEN): put long "
            "inputs in a file and pass its path"
        )
    return size


def check_command_size(command: str | list[str]) -> None:
    """ValueError (naming the limit) for a command no ``exec`` could start: a string or an
    argument over :data:`MAX_ARG_BYTES`, an argv list over :data:`MAX_ARGV_BYTES`."""
    if isinstance(command, str):
        _argument_size(command, "the command")
        return
    total = 0
    for index, arg in enumerate(command):
        total += _argument_size(arg, f"argument {index} of the command") + 1
    if total > MAX_ARGV_BYTES:
        raise ValueError(
            f"the command's arguments are {total:,} bytes together; an argv list can be at most "
            f"{MAX_ARGV_BYTES:,} bytes (the kernel's ARG_MAX also holds the environment): put "
            "long inputs in a file and pass its path"
        )


def check_folder_path(path: Path) -> Path:
    """``path`` if the run folders under it can be made, else ValueError naming the limit."""
    for part in path.parts:
        size = byte_size(part)
        if size > MAX_FOLDER_NAME_BYTES:
            raise ValueError(
                f"the folder name {quote(part)} is {size:,} bytes long; a file system allows at "
                f"most {MAX_FOLDER_NAME_BYTES} bytes for one name: shorten it"
            )
    size = byte_size(str(path))
    if size > MAX_WORKSPACE_BYTES:
        raise ValueError(
            f"the path is {size:,} bytes long; a workspace can be at most {MAX_WORKSPACE_BYTES:,} "
            "bytes (its runs, tasks and attempts add folders under it, up to the 4,096 bytes a "
            "path may have): choose a shorter one"
        )
    return path


# -- GPU memory sizes (issue 19) --------------------------------------------------------------
GPU_MEMORY_HELP = "write a size with its unit, e.g. 20G, 512M, 1.5T (binary: 1G = 1024M)"
MAX_GPU_MEMORY_MB = 64 << 20  # 64 TiB: larger is a typo
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGT])(?:I?B)?\s*$", re.IGNORECASE)
_SIZE_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def parse_gpu_memory(value: object) -> int:
    """MiB from ``"20G"``, ``"20GB"``, ``"20GiB"``, ``"512M"``, ``"1.5T"`` (binary units, as
    nvidia-smi counts). A bare number is refused: ``20`` could mean GiB or MiB."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{quote(value)} is not a memory size; {GPU_MEMORY_HELP}")
    if isinstance(value, int | float) or _NUMBER.match(value):
        raise ValueError(f"{quote(value)} has no unit; {GPU_MEMORY_HELP}")
    match = _SIZE.match(value) if len(value) <= 32 else None
    if not match:
        raise ValueError(f"{quote(value)} is not a memory size; {GPU_MEMORY_HELP}")
    mb = math.ceil(float(match.group(1)) * _SIZE_MB[match.group(2).upper()])
    if mb <= 0:
        raise ValueError(f"{quote(value)} is no memory; {GPU_MEMORY_HELP}")
    if mb > MAX_GPU_MEMORY_MB:
        raise ValueError(f"{quote(value)} is larger than any GPU (64T); {GPU_MEMORY_HELP}")
    return mb


GpuMemory = Annotated[int, BeforeValidator(parse_gpu_memory)]
