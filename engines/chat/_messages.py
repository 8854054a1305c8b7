"""LangChain messages to the Chat Completions wire, and tool specs to function tools.

User and tool text is neutralised (``fastslow.router.engine_api.neutralise_text``) on the way out: a self-hosted server
renders it into a chat template, where a ``<|turn>`` typed by a user must stay plain text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from fastslow.router import InvalidRequest
from fastslow.router.engine_api import ToolSpec, neutralise_text, strip_thoughts

__all__ = ["ImagePart", "function_tools", "to_wire", "user_content"]


ImagePart = Callable[[Mapping[str, Any], str], dict[str, Any]]
"""Builds a wire's image part from a LangChain ``image`` or an OpenAI ``image_url`` block and where it stands."""


def user_content(
    content: str | list[Any], where: str, *, text_type: str, image: ImagePart
) -> str | list[dict[str, Any]]:
    """A user message's content on an OpenAI wire: a string, or parts of text and images.

    Chat Completions and the Responses API differ only in the text part's type (``text``,
    ``input_text``) and in the image part, which ``image(block, where)`` builds. Text is neutralised.

    Raises:
        InvalidRequest: a content block the wire cannot carry, named by ``where`` and its index.
    """
    if isinstance(content, str):
        return neutralise_text(content)
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        at = f"{where}[{i}]"
        if isinstance(block, str):
            parts.append({"type": text_type, "text": neutralise_text(block)})
        elif block.get("type") == "text":
            parts.append({"type": text_type, "text": neutralise_text(str(block.get("text", "")))})
        elif block.get("type") in ("image", "image_url"):
            parts.append(image(block, at))
        else:
            raise InvalidRequest(at, f"unsupported content block type {block.get('type')!r}")
    return parts


def _image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    if block.get("type") == "image_url":
        return {"type": "image_url", "image_url": block["image_url"]}  # already this wire's shape
    # LangChain's standard image block carries a URL or base64 data; the wire wants one URL.
    url = block.get("url")
    if not url and block.get("base64"):
        url = f"data:{block.get('mime_type') or 'image/png'};base64,{block['base64']}"
    if not url:
        raise InvalidRequest(where, "an image block needs a url or base64 data")
    return {"type": "image_url", "image_url": {"url": url}}


def _assistant(message: AIMessage) -> dict[str, Any]:
    # ``.text`` skips reasoning and thinking content blocks; inline thought markup goes too.
    wire: dict[str, Any] = {"role": "assistant", "content": strip_thoughts(message.text) or None}
    if message.tool_calls:
        wire["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["args"], ensure_ascii=False)},
            }
            for call in message.tool_calls
        ]
    if wire["content"] is None and "tool_calls" not in wire:
        wire["content"] = ""  # some servers reject an assistant turn with neither
    return wire


def to_wire(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Chat Completions messages for LangChain ``System``/``Human``/``AI``/``Tool`` messages.

    Raises:
        InvalidRequest: a message type or content block the wire cannot carry.
    """
    wire: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(message, SystemMessage):
            wire.append({"role": "system", "content": message.text})
        elif isinstance(message, HumanMessage):
            content = user_content(message.content, f"{where}.content", text_type="text", image=_image_part)
            wire.append({"role": "user", "content": content})
        elif isinstance(message, AIMessage):
            wire.append(_assistant(message))
        elif isinstance(message, ToolMessage):
            content = neutralise_text(message.text)
            wire.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": content})
        else:
            raise InvalidRequest(where, f"unsupported message type {message.type!r}")
    return wire


def function_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Chat Completions function tools for ``tools``."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
        }
        for t in tools
    ]
