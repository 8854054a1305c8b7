"""The System-2 protocol: a frontier model that writes text, tool calls or structured output.

A ``ChatEngine`` returns only final content: whatever the model reasoned (thinking blocks,
reasoning items, thought channels) stays inside the engine and never reaches a ``ChatResult``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage

from ._answers import Usage

__all__ = ["ChatEngine", "ChatResult", "ToolCall", "ToolSpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool the model may call."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON schema of the arguments."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A tool call the model asked for."""

    id: str
    name: str
    args: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatResult:
    """What a System-2 call returns: final content only."""

    content: str
    model: str
    tool_calls: tuple[ToolCall, ...] = ()
    structured: Any = None
    """The parsed object when a ``schema`` was asked for."""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None


@runtime_checkable
class ChatEngine(Protocol):
    """A System-2 engine."""

    name: str
    model: str

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> ChatResult:
        """Answer ``messages``; with ``schema``, return an object matching it in ``structured``.

        Raises ``EngineError`` when the model cannot be reached or refuses the request.
        """
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
