"""What the three graphs share: the run context, outcomes, one guarded System-2 call, JSON records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage
from typing_extensions import TypedDict  # see pyproject.toml

from fastslow.router import ChatSource, EngineError
from fastslow.router.engine_api import ChatResult, ToolSpec

__all__ = [
    "NO_FRONTIER",
    "Failed",
    "GraphContext",
    "Outcome",
    "StepRecord",
    "StepStatus",
    "ai_message",
    "call_chat",
    "call_text",
    "message_record",
    "step",
]

NO_FRONTIER = "no frontier model configured"
"""The words every offline System-2 step ends with (the router's own escalation detail says the same)."""

Outcome: TypeAlias = Literal["answered", "needs_system2", "engine_error", "invalid_answer", "step_limit"]
"""How a graph run ended: answered; System 1 did its part and the next step needs a System-2 model,
none being configured (what an offline run ends with: not a failure); a model failed; the answer
failed validation even after escalation; the tool loop hit its round limit."""

StepStatus: TypeAlias = Literal["done", "skipped", "failed"]
"""A System-2 step ran (``done``), had no model configured to run on (``skipped``), or its model failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphContext:
    """Run-scoped dependencies, passed as ``context=`` to ``ainvoke`` (LangGraph's ``context_schema``)."""

    chats: ChatSource
    """Where System-2 engines come from (``fastslow.engines.chat.Frontier`` in production)."""
    agent_model: str | None = None
    """Model reference for the specialised and tool-using agents; the chat source's default when ``None``."""
    frontier_model: str | None = None
    """Model reference escalations go to; the chat source's default (``system2.default``) when ``None``."""
    draft_model: str | None = None
    """The local draft worker (``system2.draft``, e.g. ``local:qwen``); drafts are skipped when ``None``."""
    sandbox: Path | None = None
    """The only directory the demo tools may touch; they refuse to work without one."""


class StepRecord(TypedDict):
    """One System-2 step, as kept in state: who ran, on which model, how it went and what it cost."""

    node: str
    model: str | None
    status: StepStatus
    detail: str
    cost_usd: float | None
    """From the provider's token counts and ``system2.prices``; ``None`` when unpriced or nothing ran."""


@dataclass(frozen=True, slots=True)
class Failed:
    """A System-2 step that produced nothing: no model configured, or the model failed."""

    outcome: Literal["needs_system2", "engine_error"]
    note: str
    model: str | None = None


async def call_chat(
    chats: ChatSource,
    ref: str | None,
    system_prompt: str,
    messages: Sequence[BaseMessage],
    *,
    tools: Sequence[ToolSpec] = (),
    schema: Mapping[str, Any] | None = None,
) -> ChatResult | Failed:
    """One ``ChatEngine`` call; a missing model or an ``EngineError`` comes back as ``Failed``, never raised."""
    chat = chats.chat_for(ref)
    if chat is None:
        which = f" for {ref}" if ref else ""
        return Failed(
            "needs_system2",
            f"This request needs a System-2 model, but there is {NO_FRONTIER}{which}. Set "
            "FASTSLOW_SYSTEM2__DEFAULT and a key or base URL for its provider (such as OPENAI_API_KEY).",
        )
    try:
        return await chat.complete([SystemMessage(system_prompt), *messages], tools=tools, schema=schema)
    except EngineError as exc:
        return Failed("engine_error", f"The model {chat.model} failed: {exc}", model=chat.model)


def ai_message(result: ChatResult, node: str) -> AIMessage:
    """The final content (and tool calls) of a System-2 reply as an ``AIMessage`` named after its node."""
    calls = [{"id": c.id, "name": c.name, "args": dict(c.args), "type": "tool_call"} for c in result.tool_calls]
    return AIMessage(
        content=result.content,
        name=node,
        tool_calls=calls,
        response_metadata={"model_name": result.model},
    )


def call_text(call: Mapping[str, Any]) -> str:
    """A tool call for people, ``name(key=value, ...)``: a ``ToolCall`` dict or its JSON record."""
    args = call.get("args") or {}
    return f"{call.get('name')}({', '.join(f'{k}={v}' for k, v in args.items())})"


def step(node: str, outcome: ChatResult | Failed, detail: str = "") -> StepRecord:
    if isinstance(outcome, Failed):
        status: StepStatus = "skipped" if outcome.outcome == "needs_system2" else "failed"
        return {"node": node, "model": outcome.model, "status": status, "detail": outcome.note, "cost_usd": None}
    return {"node": node, "model": outcome.model, "status": "done", "detail": detail, "cost_usd": outcome.cost_usd}


def message_record(message: BaseMessage) -> dict[str, Any]:
    """A message as JSON-able data: ``type`` and ``content``, plus name, tool calls and tool-call id when set."""
    record: dict[str, Any] = {"type": message.type, "content": message.content}
    if message.name:
        record["name"] = message.name
    if isinstance(message, AIMessage) and message.tool_calls:
        record["tool_calls"] = [{"id": c["id"], "name": c["name"], "args": c["args"]} for c in message.tool_calls]
    for key in ("tool_call_id", "status"):
        value = getattr(message, key, None)
        if value:
            record[key] = value
    return record
