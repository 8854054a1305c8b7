"""System-2 chat engines: model references, the Chat Completions engine, and the ``Frontier`` chat source."""

from ._frontier import Frontier
from ._openai import OpenAIChatEngine
from ._ref import ModelRef, Provider

__all__ = ["Frontier", "ModelRef", "OpenAIChatEngine", "Provider"]
