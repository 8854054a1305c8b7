"""System-2 chat engines: model references, the Responses, Chat Completions and Anthropic engines, the
``Frontier`` chat source, and the opt-in thought sink.

``call_cost(price, input_tokens=..., output_tokens=...)`` is what one call costs at a model's
``ModelPrice``, as the engines count it, for code that reports costs from logged token counts.
``provider_configured(provider, settings)`` says whether ``Frontier`` would build a provider's
engines, without building one (no SDK is imported).
"""

from typing import TYPE_CHECKING

from ._cost import call_cost
from ._frontier import Frontier, OpenAIApi, provider_configured
from ._ref import ModelRef, Provider
from ._thoughts import ThoughtSink, keep_thoughts

if TYPE_CHECKING:
    from ._anthropic import AnthropicChatEngine
    from ._openai import OpenAIChatEngine
    from ._responses import OpenAIResponsesEngine

__all__ = [
    "AnthropicChatEngine",
    "Frontier",
    "ModelRef",
    "OpenAIApi",
    "OpenAIChatEngine",
    "OpenAIResponsesEngine",
    "Provider",
    "ThoughtSink",
    "call_cost",
    "keep_thoughts",
    "provider_configured",
]

# The engines import their provider's SDK: loaded on first use, as ``Frontier`` loads them.
_ENGINES = {
    "AnthropicChatEngine": "._anthropic",
    "OpenAIChatEngine": "._openai",
    "OpenAIResponsesEngine": "._responses",
}


def __getattr__(name: str) -> object:
    if name in _ENGINES:
        import importlib

        value = getattr(importlib.import_module(_ENGINES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
