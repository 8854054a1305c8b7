"""Engine plugins: an installed ``fastslow.engines`` entry point loaded, checked and made an engine factory.

A plugin's code is imported here only, when an engine of it is first built (the policy or the
settings name it); listing the installed engines reads metadata alone. What the entry point names
must be an ``EnginePlugin`` (or an object with its attributes) written for this fastslow's
``ENGINE_API_VERSION``; anything else is a ``ConfigError`` naming the plugin and its distribution.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from fastslow.router.engine_api import (
    ENGINE_API_VERSION,
    ConfigError,
    DecisionEngine,
    EngineContext,
    installed_engines,
    plugin_engines,
    settings_key,
)

if TYPE_CHECKING:
    from ._registry import EngineBuild, EngineFactory

__all__ = ["plugin_factory"]


def plugin_factory(name: str) -> EngineFactory:
    """The factory of plugin engine ``name``: its entry point loaded and its ``api_version`` checked.

    Raises:
        ConfigError: no installed engine has that name (the message lists those installed), or the
            plugin does not load, is not a plugin, or was written for another engine-API version.
    """
    entry = plugin_engines().get(name)
    if entry is None:
        raise ConfigError(
            f"unknown engine {name!r}; expected one of the installed engines: {', '.join(installed_engines())}",
            key="engine",
        )
    plugin = _load(entry)
    return lambda build: _build(plugin, build)


def _origin(entry: EntryPoint) -> str:
    dist = entry.dist
    where = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"engine plugin {entry.name!r} ({entry.value}, from {where})"


def _load(entry: EntryPoint) -> Any:
    origin = _origin(entry)
    try:
        plugin = entry.load()
    except Exception as exc:  # the plugin's own import failed: whatever it raised is its mistake
        raise ConfigError(f"{origin} failed to load: {type(exc).__name__}: {exc}", key="engine") from exc
    # The version first: a plugin written for another version may have any other shape.
    version = getattr(plugin, "api_version", None)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError(
            f"{origin} declares no engine-API version (an int api_version); "
            f"this fastslow speaks version {ENGINE_API_VERSION}",
            key="engine",
        )
    if version != ENGINE_API_VERSION:
        raise ConfigError(
            f"{origin} is written for engine-API version {version}, and this fastslow speaks version "
            f"{ENGINE_API_VERSION}; install a release of the plugin made for it",
            key="engine",
        )
    if getattr(plugin, "name", None) != entry.name or not callable(getattr(plugin, "build", None)):
        raise ConfigError(
            f"{origin} is not an EnginePlugin named {entry.name!r} with a build(settings, context)", key="engine"
        )
    return plugin


def _build(plugin: Any, build: EngineBuild) -> DecisionEngine:
    settings = build.settings
    key = settings_key(plugin.name)
    raw: dict[str, Any] = dict(settings.engines.get(key, {}))
    model = getattr(plugin, "settings", None)
    own: Any = raw
    if model is not None:
        try:
            own = TypeAdapter(model).validate_python(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in ("engines", key, *first["loc"]))
            raise ConfigError(f"settings of engine plugin {plugin.name!r}: {first['msg']}", key=where) from exc
    context = EngineContext(
        name=plugin.name,
        max_reply_bytes=settings.limits.max_engine_reply_bytes,
        max_state_chars=settings.max_state_chars,
        data_dir=settings.resolved_data_dir(),
    )
    engine = plugin.build(own, context)
    if not isinstance(engine, DecisionEngine):
        raise ConfigError(
            f"engine plugin {plugin.name!r}: build returned {type(engine).__name__}, not a DecisionEngine"
        )
    return engine
