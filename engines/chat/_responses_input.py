"""LangChain messages to the Responses API's ``instructions`` and ``input`` items, tools to function tools.

User and tool text is neutralised (``fastslow.router.engine_api.neutralise_text``) on the way out,
as for Chat Completions.
Assistant turns carry their final content and tool calls only: reasoning items are never part of
the history fastslow keeps, so none is ever sent back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from fastslow.router import InvalidRequest
from fastslow.router.engine_api import ToolSpec, neutralise_text, strip_thoughts

from ._messages import user_content

__all__ = ["function_tools", "to_input"]


def _image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if block.get("type") == "image_url":
        ref = block.get("image_url")
        url = ref.get("url") if isinstance(ref, Mapping) else ref
    else:
        url = block.get("url")
        if not url and block.get("base64"):
            url = f"data:{block.get('mime_type') or 'image/png'};base64,{block['base64']}"
    if not url:
        raise InvalidRequest(where, "an image block needs a url or base64 data")
    return {"type": "input_image", "image_url": url, "detail": "auto"}


def to_input(messages: Sequence[BaseMessage]) -> tuple[str | None, list[dict[str, Any]]]:
    """``(instructions, input items)`` for LangChain ``System``/``Human``/``AI``/``Tool`` messages.

    Leading system messages become ``instructions``; a system message later in the conversation
    becomes a developer message in place. An AI turn's tool calls become ``function_call`` items
    and tool results ``function_call_output`` items.

    Raises:
        InvalidRequest: a message type or content block the wire cannot carry.
    """
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(message, SystemMessage):
            if items:
                items.append({"role": "developer", "content": message.text})
            else:
                instructions.append(message.text)
        elif isinstance(message, HumanMessage):
            content = user_content(message.content, f"{where}.content", text_type="input_text", image=_image)
            items.append({"role": "user", "content": content})
        elif isinstance(message, AIMessage):
            # ``.text`` skips reasoning and thinking content blocks; inline thought markup goes too.
            if text := strip_thoughts(message.text):
                items.append({"role": "assistant", "content": text})
            items.extend(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": json.dumps(call["args"], ensure_ascii=False),
                }
                for call in message.tool_calls
            )
        elif isinstance(message, ToolMessage):
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": neutralise_text(message.text),
                }
            )
        else:
            raise InvalidRequest(where, f"unsupported message type {message.type!r}")
    return ("\n\n".join(instructions) if instructions else None), items


def function_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Responses function tools for ``tools``; not strict, since their schemas need not meet strict mode's rules."""
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": dict(t.parameters),
            "strict": False,
        }
        for t in tools
    ]
