"""Engine names, shipped and from plugins, and the contract an engine plugin implements.

A shipped engine is one of ``EngineName``; any other engine comes from a distribution that
registers it in the ``fastslow.engines`` entry-point group, under the name policies and settings
use::

    [project.entry-points."fastslow.engines"]
    toy = "toy_engine:plugin"

The entry point names an ``EnginePlugin``. Listing the installed engines reads the installed
distributions' metadata only: no plugin's code is imported until an engine of it is built
(``fastslow.engines`` loads it then, checking its ``api_version``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Generic, Literal, TypeVar, get_args

from ._engine import DecisionEngine

__all__ = [
    "ENGINE_GROUP",
    "SHIPPED_ENGINES",
    "EngineContext",
    "EngineName",
    "EnginePlugin",
    "installed_engines",
    "plugin_engines",
    "settings_key",
    "unknown_engine",
]

EngineName = Literal["embedded", "sparrow", "examples", "jev", "openai-decisions", "logprob"]
"""The shipped engines' names; an engine plugin adds its own (any ``str`` in ``installed_engines()``)."""
SHIPPED_ENGINES: tuple[str, ...] = get_args(EngineName)
ENGINE_GROUP = "fastslow.engines"
"""The entry-point group engine plugins register in."""

S = TypeVar("S")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineContext:
    """What fastslow hands a plugin's ``build`` besides the plugin's own settings."""

    name: str
    """The name the engine is installed and named under: give it to the engine's ``name``."""
    max_reply_bytes: int
    """The most of a server's reply body to read (``Settings.limits.max_engine_reply_bytes``)."""
    max_state_chars: int
    """The largest state any engine is asked about (``Settings.max_state_chars``)."""
    data_dir: Path
    """fastslow's data directory: keep caches in a folder named after the engine under it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnginePlugin(Generic[S]):
    """An engine a third-party distribution adds, named by its ``fastslow.engines`` entry point.

    ``build`` gets the plugin's settings namespace (``FASTSLOW_ENGINES__<NAME>__<KEY>``, or
    ``[engines.<name>]`` in the settings file) validated into ``settings`` (a pydantic model, a
    dataclass or a ``TypedDict``), or as a plain ``dict`` when ``settings`` is ``None``. An engine
    built from a plugin counts as a network engine: it sits behind a circuit breaker and shares the
    remote engines' concurrency limit.
    """

    name: str
    """The engine's name: its entry point's name."""
    api_version: int
    """The engine-API version the plugin was written for (``fastslow.router.engine_api.ENGINE_API_VERSION``
    then): write the number, so that a fastslow speaking another version refuses the plugin."""
    build: Callable[[S, EngineContext], DecisionEngine]
    """Make the engine; raise ``ConfigError`` for settings it cannot start with."""
    settings: type[S] | None = None


def plugin_engines() -> dict[str, EntryPoint]:
    """The engines installed plugins register, by name, from metadata alone (nothing is imported).

    A plugin cannot replace a shipped engine: an entry point under a shipped name is left out.
    Where two distributions register one name, the first on the path wins (as ``import`` does).
    """
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=ENGINE_GROUP):
        if entry.name not in SHIPPED_ENGINES:
            found.setdefault(entry.name, entry)
    return found


def installed_engines() -> tuple[str, ...]:
    """Every engine a policy or the settings may name: the shipped ones, then the plugins' (sorted)."""
    return (*SHIPPED_ENGINES, *sorted(plugin_engines()))


def unknown_engine(name: object) -> str | None:
    """``None`` for an installed engine's name, else the message saying so and listing the installed ones."""
    if name in SHIPPED_ENGINES:  # the common case reads no metadata
        return None
    installed = installed_engines()
    if name in installed:
        return None
    return f"unknown engine {name!r}; expected one of the installed engines: {', '.join(installed)}"


def settings_key(name: str) -> str:
    """The key of engine ``name``'s settings namespace in ``Settings.engines``: lower case, ``-`` as ``_``.

    Environment variables cannot hold ``-``: ``FASTSLOW_ENGINES__MY_ENGINE__URL`` sets ``url`` of ``my-engine``.
    """
    return name.lower().replace("-", "_")
