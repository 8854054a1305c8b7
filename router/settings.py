"""Operators' settings, in one place: every ``FASTSLOW_*`` setting's type and ``get_settings()``.

For operators and for the code that reads a setting (engines take their own block: ``JevSettings``,
``EmbeddedSettings``, ...). ``Settings`` is the whole tree, read from ``FASTSLOW_*`` environment
variables (nested keys with ``__``: ``FASTSLOW_JEV__BASE_URL``) and an optional TOML or YAML
settings file (``FASTSLOW_SETTINGS_FILE``, default ``fastslow.toml``); ``get_settings()`` builds
it once per process. Each field is documented on its class; ``docs/deploy.md`` and
``docs/limits.md`` say what the knobs do.

Graph authors need only ``Settings`` and ``get_settings``, which ``fastslow`` and
``fastslow.router`` also give.
"""

from ._settings import (
    AuthThrottleSettings,
    BreakerSettings,
    CoalesceSettings,
    ConsoleSettings,
    EmbeddedSettings,
    EngineName,
    JevProfileName,
    JevSettings,
    LearningSettings,
    LimitsSettings,
    LoggingSettings,
    LogprobSettings,
    MetricsSettings,
    ModelPrice,
    OpenAIDecisionsSettings,
    ReviewSettings,
    ServerSettings,
    Settings,
    StoreSettings,
    System2Settings,
    TracingSettings,
    WebhookSettings,
    get_settings,
)

__all__ = [
    "AuthThrottleSettings",
    "BreakerSettings",
    "CoalesceSettings",
    "ConsoleSettings",
    "EmbeddedSettings",
    "EngineName",
    "JevProfileName",
    "JevSettings",
    "LearningSettings",
    "LimitsSettings",
    "LoggingSettings",
    "LogprobSettings",
    "MetricsSettings",
    "ModelPrice",
    "OpenAIDecisionsSettings",
    "ReviewSettings",
    "ServerSettings",
    "Settings",
    "StoreSettings",
    "System2Settings",
    "TracingSettings",
    "WebhookSettings",
    "get_settings",
]
