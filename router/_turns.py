"""The text a routing decision reads: the current user turn plus a bounded window before it."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from ._sanitize import strip_thoughts

__all__ = ["split_turns"]


def _text(message: BaseMessage) -> str:
    # ``.text`` keeps only text content blocks (no thinking, reasoning or tool-use blocks);
    # thought markup inside the text itself goes too.
    return strip_thoughts(message.text)


def split_turns(messages: Sequence[BaseMessage], context_turns: int) -> tuple[str, tuple[str, ...]]:
    """Return the latest user turn's text and up to ``context_turns`` earlier turns as ``role: text``.

    Tool messages and assistant turns that only call tools are skipped: they are not conversation.
    """
    index = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)), None)
    if index is None:
        return "", ()
    current = _text(messages[index])
    earlier: list[str] = []
    for message in reversed(messages[:index]):
        if len(earlier) >= context_turns:
            break
        if isinstance(message, (HumanMessage, AIMessage)):
            text = _text(message)
            if text:
                role = "user" if isinstance(message, HumanMessage) else "assistant"
                earlier.append(f"{role}: {text}")
    return current, tuple(reversed(earlier))
