"""Thought hygiene for ``create_agent``: what a chat model thought never reaches the agent's state.

The same rule as at fastslow's own engine boundary (``fastslow.engines.chat``): reasoning and
thinking content blocks, ``reasoning`` / ``reasoning_content`` fields, and ``<think>…</think>`` or
DiffusionGemma ``<|channel>thought…<channel|>`` text (closed, unclosed, or opened by the chat
template so that only the closing marker comes back) are cut from every ``AIMessage`` before it is
written to state, and so before any checkpoint.
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from fastslow.router.engine_api import strip_thoughts

__all__ = ["THOUGHT_BLOCK_TYPES", "without_thoughts"]

THOUGHT_BLOCK_TYPES = frozenset({"thinking", "redacted_thinking", "reasoning"})
"""Content block types that carry a thought (Anthropic, OpenAI Responses, LangChain's standard blocks)."""

_THOUGHT_FIELDS = ("reasoning", "reasoning_content", "thinking")

# The same closing-marker rule as ``fastslow.engines.chat._thoughts.final_content``, which the
# graphs layer may not import: a template-opened thought leaves only its closing marker.
_CLOSING = re.compile(r"</think>|<channel\|>", re.IGNORECASE)


def _final_text(text: str) -> str:
    return _CLOSING.split(strip_thoughts(text))[-1].strip()


def _block(block: Any) -> Any:
    """A content block without thought text, or ``None`` when the whole block is a thought."""
    if isinstance(block, str):
        return _final_text(block)
    if not isinstance(block, dict):
        return block
    if block.get("type") in THOUGHT_BLOCK_TYPES:
        return None
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return {**block, "text": _final_text(block["text"])}
    return block


def without_thoughts(message: BaseMessage) -> BaseMessage:
    """``message`` with its thoughts cut out; messages other than ``AIMessage`` are returned as they are."""
    if not isinstance(message, AIMessage):
        return message
    content: str | list[str | dict[Any, Any]]
    if isinstance(message.content, str):
        content = _final_text(message.content)
    else:
        content = [kept for block in message.content if (kept := _block(block)) is not None]
    extra = {k: v for k, v in message.additional_kwargs.items() if k not in _THOUGHT_FIELDS}
    metadata = {k: v for k, v in message.response_metadata.items() if k not in _THOUGHT_FIELDS}
    return message.model_copy(update={"content": content, "additional_kwargs": extra, "response_metadata": metadata})
