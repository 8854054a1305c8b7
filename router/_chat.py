"""The System-2 protocol: a frontier model that writes text, tool calls or structured output.

A ``ChatEngine`` returns only final content: whatever the model reasoned (thinking blocks,
reasoning items, thought channels) stays inside the engine and never reaches a ``ChatResult``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from langchain_core.messages import BaseMessage

from ._answers import Usage

__all__ = ["THOUGHT_TASK", "ChatEngine", "ChatResult", "ToolCall", "ToolOutcome", "ToolRunner", "ToolSpec", "ToolStep"]


THOUGHT_TASK: ContextVar[str | None] = ContextVar("fastslow_thought_task", default=None)
"""The task whose System-2 call is running, set only when that task opted in to keeping thoughts
(``debug_thoughts``); engines hand thoughts to the debug sink only while it is set."""


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
class ToolOutcome:
    """What running (or refusing) one tool call produced, as the model will see it."""

    content: str
    is_error: bool = False


ToolRunner = Callable[[ToolCall], Awaitable[ToolOutcome]]
"""Runs one tool call, after the policy gate, for an engine that keeps the tool loop inside its call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolStep:
    """One round of a tool loop run inside the engine: the call and its outcome (never a thought)."""

    call: ToolCall
    outcome: ToolOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatResult:
    """What a System-2 call returns: final content only."""

    content: str
    model: str
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls the model asks the caller to run (only when no ``tool_runner`` was given)."""
    steps: tuple[ToolStep, ...] = ()
    """Tool rounds the engine ran itself through ``tool_runner``, in order."""
    structured: Any = None
    """The parsed object when a ``schema`` was asked for."""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None


@runtime_checkable
class ChatEngine(Protocol):
    """A System-2 engine."""

    name: str
    model: str

    @property
    def base_url(self) -> str | None:
        """Where the engine sends data; ``local_only`` tasks escalate only to allow-listed ones."""
        ...

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: ToolRunner | None = None,
    ) -> ChatResult:
        """Answer ``messages``; with ``schema``, return an object matching it in ``structured``.

        With ``tool_runner``, the engine runs the tool loop itself (calling ``tool_runner`` for each
        call) until the model answers without tools; provider state that must travel within the
        loop, such as Anthropic's signed thinking blocks, never leaves the call.

        Raises ``EngineError`` when the model cannot be reached or refuses the request.
        """
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
