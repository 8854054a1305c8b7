"""System-2 chat engines: model references, the Responses, Chat Completions and Anthropic engines, the
``Frontier`` chat source, and the opt-in thought sink.

``call_cost(price, input_tokens=..., output_tokens=...)`` is what one call costs at a model's
``ModelPrice``, as the engines count it, for code that reports costs from logged token counts.
"""

from ._anthropic import AnthropicChatEngine
from ._cost import call_cost
from ._frontier import Frontier, OpenAIApi
from ._openai import OpenAIChatEngine
from ._ref import ModelRef, Provider
from ._responses import OpenAIResponsesEngine
from ._thoughts import ThoughtSink, keep_thoughts

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
]
