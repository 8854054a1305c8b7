"""LangChain messages to Anthropic's Messages wire, and tool specs to Anthropic tools.

History never carries thinking: only the text of an AI message is sent (``AIMessage.text`` skips
the ``thinking`` / ``reasoning`` blocks a LangChain integration may have kept), because a signed
thinking block is only valid inside the tool loop of the model that wrote it.

Text is sent as written, not neutralised: Anthropic's server renders no chat template from it, so a
``<|turn>`` typed by a user cannot open a turn there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from fastslow.router import InvalidRequest
from fastslow.router.engine_api import ToolSpec

__all__ = ["anthropic_tools", "to_anthropic"]

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)

Block = dict[str, Any]


def _text(text: str) -> list[Block]:
    # The API rejects empty text blocks.
    return [{"type": "text", "text": text}] if text else []


def _image(url: str | None, data: str | None, mime: str | None, where: str) -> Block:
    if url and (match := _DATA_URL.fullmatch(url)):
        mime, data, url = match["mime"], match["data"], None
    if url:
        return {"type": "image", "source": {"type": "url", "url": url}}
    if data:
        return {"type": "image", "source": {"type": "base64", "media_type": mime or "image/png", "data": data}}
    raise InvalidRequest(where, "an image block needs a url or base64 data")


def _user_blocks(content: str | list[Any], where: str) -> list[Block]:
    if isinstance(content, str):
        return _text(content)
    blocks: list[Block] = []
    for i, block in enumerate(content):
        at = f"{where}[{i}]"
        if isinstance(block, str):
            blocks += _text(block)
        elif block.get("type") == "text":
            blocks += _text(str(block.get("text", "")))
        elif block.get("type") == "image":  # LangChain's standard block
            blocks.append(_image(block.get("url"), block.get("base64"), block.get("mime_type"), at))
        elif block.get("type") == "image_url":  # the OpenAI shape
            image_url = block.get("image_url")
            url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
            blocks.append(_image(url, None, None, at))
        else:
            raise InvalidRequest(at, f"unsupported content block type {block.get('type')!r}")
    return blocks


def _assistant_blocks(message: AIMessage) -> list[Block]:
    blocks = _text(message.text)
    blocks += [
        {"type": "tool_use", "id": call["id"], "name": call["name"], "input": dict(call["args"])}
        for call in message.tool_calls
    ]
    return blocks


def _tool_result(message: ToolMessage) -> Block:
    block: Block = {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.text}
    if message.status == "error":
        block["is_error"] = True
    return block


def to_anthropic(messages: Sequence[BaseMessage]) -> tuple[str | None, list[dict[str, Any]]]:
    """The ``system`` prompt and ``messages`` for LangChain ``System``/``Human``/``AI``/``Tool`` messages.

    System messages, wherever they stand, join the one top-level ``system`` prompt; tool results
    become ``tool_result`` blocks opening a user turn; consecutive turns of one role are merged, as the
    API requires alternating turns; empty turns are left out.

    Raises:
        InvalidRequest: a message type or content block the wire cannot carry, or no user or
            assistant content at all.
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(message, SystemMessage):
            if message.text:
                system.append(message.text)
            continue
        if isinstance(message, HumanMessage):
            role, blocks = "user", _user_blocks(message.content, f"{where}.content")
        elif isinstance(message, AIMessage):
            role, blocks = "assistant", _assistant_blocks(message)
        elif isinstance(message, ToolMessage):
            role, blocks = "user", [_tool_result(message)]
        else:
            raise InvalidRequest(where, f"unsupported message type {message.type!r}")
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if not turns:
        raise InvalidRequest("messages", "no user or assistant content to answer")
    for turn in turns:
        # Tool results must open the user turn that answers a tool_use (stable sort: order kept otherwise).
        turn["content"].sort(key=lambda block: block["type"] != "tool_result")
    return ("\n\n".join(system) or None), turns


def anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Anthropic tool definitions for ``tools``."""
    return [{"name": t.name, "description": t.description, "input_schema": dict(t.parameters)} for t in tools]
