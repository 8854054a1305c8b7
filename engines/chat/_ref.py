"""Model references such as ``openai:gpt-5.5``, parsed once into a typed value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

from fastslow.router import ConfigError

__all__ = ["ModelRef", "Provider"]

Provider: TypeAlias = Literal["openai", "anthropic", "local"]
"""Where a System-2 model runs: OpenAI (or any OpenAI-compatible server), Anthropic, or a self-hosted server."""

_PROVIDERS: tuple[str, ...] = get_args(Provider)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRef:
    """A System-2 model: which provider serves it and the model name that provider knows it by."""

    provider: Provider
    model: str
    """The provider's model name; may itself contain ``:`` (``local:qwen3:8b`` for Ollama)."""

    @classmethod
    def parse(cls, ref: str, *, key: str = "system2.default") -> ModelRef:
        """Parse ``PROVIDER:MODEL``.

        Args:
            ref: the reference, such as ``openai:gpt-5.5``, ``anthropic:claude-sonnet-4-6`` or ``local:qwen``.
            key: the setting or policy key the reference came from, named in the error.

        Raises:
            ConfigError: the string has no provider, an unknown provider or no model.
        """
        provider, sep, model = ref.strip().partition(":")
        if not sep:
            raise ConfigError(f"model reference {ref!r} needs a provider: PROVIDER:MODEL, e.g. openai:gpt-5.5", key=key)
        provider = provider.strip().lower()
        model = model.strip()
        if provider not in _PROVIDERS:
            known = ", ".join(_PROVIDERS)
            raise ConfigError(f"model reference {ref!r} names unknown provider {provider!r}; known: {known}", key=key)
        if not model:
            raise ConfigError(f"model reference {ref!r} names no model", key=key)
        return cls(provider=provider, model=model)  # type: ignore[arg-type]  # checked against Provider above

    def __str__(self) -> str:
        return f"{self.provider}:{self.model}"
