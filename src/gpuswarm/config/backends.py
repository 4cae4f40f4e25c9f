"""The backend registry: every backend declares itself, its settings and its CLI options here.

A backend is a :class:`BackendPlugin`: its name (``backend: NAME``), where its implementation is
(``factory``, ``module:Class``, imported only by :func:`gpuswarm.exec.base.create_backend` when a
run uses it), its own settings model (the config's ``NAME:`` block; the core config model knows
no backend's block), the options it adds to ``run`` / ``resume`` / ``research init`` and the
capabilities the composition asks about (whether its slots are its own, whether its attempts
see this host's files, ...). So a backend is one package, touching no other file.

Found, once per process, in this order: ``local`` and ``wrapped`` (below), every package of
``gpuswarm.exec`` with a ``plugin`` module (its ``PLUGIN``), then every entry point of the group
``gpuswarm.backends`` (``name = "module:PLUGIN"`` in an installed distribution's
``entry_points.txt``: a backend outside gpuswarm). The declaration modules import only
gpuswarm's config and core (and pydantic): loading them never loads a backend.

The config model a file is validated with is the core one (:class:`RunConfig`) plus one
optional field per backend with settings (:func:`config_model`), so errors in a backend's block
name file:line and the field as any other's.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, TypeVar

from pydantic import BaseModel, create_model

from gpuswarm.core.errors import ConfigError

ENTRY_POINTS = "gpuswarm.backends"  # the entry point group of backends outside gpuswarm
_BUILTIN_HOME = "gpuswarm.exec"  # packages here with a ``plugin`` module are backends


@dataclass(frozen=True)
class Option:
    """One command-line option a backend adds to some commands (click's terms)."""

    decls: tuple[str, ...]  # e.g. ("--docker-arg", "docker_args"): the flag, then its dest
    help: str
    commands: frozenset[str] = frozenset({"run"})  # "run", "resume", "research init"
    multiple: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        """The keyword the command receives (click's: the flag's name, or the second decl)."""
        if len(self.decls) > 1 and not self.decls[1].startswith("-"):
            return self.decls[1]
        return self.decls[0].lstrip("-").replace("-", "_")

    def given(self, values: Mapping[str, Any]) -> bool:
        return bool(values.get(self.dest))


#: a backend's settings with the command's option values over them (ConfigError naming the
#: flag); ``settings`` None: the config has no block of this backend
ApplyOptions = Callable[[BaseModel | None, Mapping[str, Any]], BaseModel]


class Moved(TypedDict):
    """What a resume whose options moved the backend journals (the ``slots`` event's fields):
    ``change`` "moved", where it is now and where it was."""

    change: str
    address: str
    before: str


@dataclass(frozen=True)
class BackendPlugin:
    """What a backend declares. The defaults are a local backend's."""

    name: str
    factory: str  # "module:Class": its Backend, imported only when a run uses it
    settings: type[BaseModel] | None = None  # its config block's model (None: it has none)
    needs_block: str = ""  # the error when ``backend: NAME`` has no block ("": defaults apply)
    options: tuple[Option, ...] = ()
    apply_options: ApplyOptions | None = None  # the options' values over the block
    refuse_options: Callable[[str], str] | None = None  # why its options cannot go with backend X
    owns_slots: bool = False  # its slots are its own (a cluster's): --gpus filters its GPUs
    slots_phrase: str = ""  # how the start line names those slots, e.g. "the X cluster's GPUs"
    single_driver: str = ""  # non-empty: a second supervisor (``work``) is refused, saying so
    isolates_home: bool = False  # every slot gets a private HOME, whatever ``home.isolate`` says
    runs_on_host: bool = True  # False: attempts see another filesystem (a container's image)
    pass_env: Callable[[BaseModel, list[str]], BaseModel] | None = None  # variables by name
    resume_moved: Callable[[BaseModel, Mapping[str, Any]], Moved | None] | None = None
    on_cli: bool = True  # offered by ``--backend`` (wrapped: by ``backend:`` only, for tests)
    # "module:object": an app.setup.RunDriver that runs the run from this host with no supervisor,
    # slot or GPU work here (its workers elsewhere run the attempts: slurm's worker jobs);
    # imported only when a run uses it. "": a supervisor here runs the attempts
    driver: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)  # anything else it wants to say

    def defaults(self) -> BaseModel | None:
        """Its settings when the config has no block (None: it needs one, or has none)."""
        if self.settings is None or self.needs_block:
            return None
        return self.settings()

    def options_for(self, command: str) -> tuple[Option, ...]:
        return tuple(o for o in self.options if command in o.commands)


LOCAL = BackendPlugin("local", "gpuswarm.exec.local.backend:LocalBackend")
WRAPPED = BackendPlugin("wrapped", "gpuswarm.exec.wrapped:WrappedBackend", on_cli=False)


@functools.cache
def plugins() -> Mapping[str, BackendPlugin]:
    """Every backend, by name (see the module's doc for where they are found)."""
    found: dict[str, BackendPlugin] = {"local": LOCAL, "wrapped": WRAPPED}
    home = importlib.import_module(_BUILTIN_HOME)
    for info in sorted(pkgutil.iter_modules(home.__path__), key=lambda m: m.name):
        module = f"{_BUILTIN_HOME}.{info.name}.plugin"
        if info.ispkg and importlib.util.find_spec(module) is not None:
            _register(found, importlib.import_module(module).PLUGIN, module)
    for point in importlib.metadata.entry_points(group=ENTRY_POINTS):
        _register(found, point.load(), f"entry point {point.name} ({point.value})")
    return found


def _register(found: dict[str, BackendPlugin], plugin: object, where: str) -> None:
    if not isinstance(plugin, BackendPlugin):
        raise ConfigError(f"backend plugin {where}: not a BackendPlugin ({type(plugin).__name__})")
    if plugin.name in found:  # a config key's name: config_model refuses it
        raise ConfigError(
            f"backend plugin {where}: the name {plugin.name!r} is taken (another backend); "
            "give the backend another name"
        )
    found[plugin.name] = plugin


def backend_names() -> list[str]:
    """The names a config's ``backend:`` (and ``--backend``) may take."""
    return sorted(plugins())


def plugin_of(name: str) -> BackendPlugin:
    """The backend called ``name`` (KeyError when there is none)."""
    return plugins()[name]


def with_settings() -> list[BackendPlugin]:
    """The backends with a config block of their own, in registry order."""
    return [p for p in plugins().values() if p.settings is not None]


class BackendBlocks(Protocol):
    """A config model with a ``backend:`` and the backends' blocks (config/models.py's
    ``BackendBlocks``; a protocol here, so the registry imports no config model)."""

    backend: str

    def backend_block(self) -> BaseModel | None: ...


_M = TypeVar("_M", bound=BaseModel)
_COMPOSED: set[type[BaseModel]] = set()


@functools.cache
def config_model(base: type[_M]) -> type[_M]:
    """The whole model of ``base`` (the core :class:`RunConfig`, research's settings): its own
    fields and one optional field per backend with settings, named as the backend."""
    if base in _COMPOSED:
        return base
    blocks: dict[str, Any] = {}  # create_model types its field definitions as Any
    for plugin in with_settings():
        if plugin.name in base.model_fields:
            raise ConfigError(
                f"backend {plugin.name!r}: its name is a key of {base.__name__} (taken); give "
                "the backend another name"
            )
        assert plugin.settings is not None
        blocks[plugin.name] = (plugin.settings | None, None)
    model = create_model(base.__name__, __base__=base, __module__=base.__module__, **blocks)
    _COMPOSED.add(model)
    return model


def settings_of(config: BackendBlocks) -> BaseModel | None:
    """The settings of the config's backend: its block, or its defaults where it has none."""
    block = config.backend_block()
    if block is not None:
        return block
    plugin = plugins().get(config.backend)
    return plugin.defaults() if plugin is not None else None


def check_blocks(config: BackendBlocks) -> None:
    """A backend's block goes with that backend only; one that needs its block has it
    (ValueError: the config validator's, located as a model error)."""
    for plugin in with_settings():
        block = getattr(config, plugin.name, None)
        if block is None and config.backend == plugin.name and plugin.needs_block:
            raise ValueError(plugin.needs_block)
        if block is not None and config.backend != plugin.name:
            raise ValueError(
                f"{plugin.name}: is set but backend is {_quote(config.backend)}; add backend: "
                f"{plugin.name} (or remove the {plugin.name}: block)"
            )


def _quote(text: str) -> str:
    from gpuswarm.config.yamlload import quote

    return quote(text)


def options_given(values: Mapping[str, Any]) -> list[BackendPlugin]:
    """The backends some of whose options have values in ``values`` (a command's keywords)."""
    return [p for p in plugins().values() if any(o.given(values) for o in p.options)]


_F = TypeVar("_F", bound=Callable[..., Any])


def click_options(command: str, *, choose: str | None = None) -> Callable[[_F], _F]:
    """A decorator adding to a click command every backend's options for ``command`` ("run",
    "resume", "research init"), after ``--backend`` (a choice of the registry's names) when
    ``choose`` is its help. The command receives them as keywords (:attr:`Option.dest`)."""
    import click  # the CLI's: only the commands that take backend options load this

    def decorate(func: _F) -> _F:
        seen: set[str] = set()
        options: list[Callable[[_F], _F]] = []
        for plugin in plugins().values():
            for option in plugin.options_for(command):
                if option.dest not in seen:
                    seen.add(option.dest)
                    kind = click.Choice(list(option.choices)) if option.choices else None
                    options.append(
                        click.option(
                            *option.decls, help=option.help, multiple=option.multiple, type=kind
                        )
                    )
        for add in reversed(options):
            func = add(func)
        if choose is not None:
            names = [p.name for p in plugins().values() if p.on_cli]
            default = "local" if command == "research init" else None
            backend = click.option(
                "--backend", type=click.Choice(names), default=default, help=choose
            )
            func = backend(func)
        return func

    return decorate
