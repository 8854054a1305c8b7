"""The conversation a decision reads: the current user turn plus a bounded window before it.

A conversation comes in any form LangChain takes (``convert_to_messages``): message objects,
``{"role": ..., "content": ...}`` dicts, ``(role, text)`` pairs and plain strings as items, a
``PromptValue``, or one plain string as a single user turn. A list of messages (what LangGraph's
``add_messages`` keeps in state) is read as it is: an item is converted only when it is read and is
not a message already, so a long conversation costs nothing extra on every routing step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias, cast

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    MessageLikeRepresentation,
    convert_to_messages,
)

from ._errors import InvalidRequest
from ._sanitize import strip_thoughts

if TYPE_CHECKING:
    # Imported where a conversation is no sequence: the module takes tens of milliseconds to load.
    from langchain_core.prompt_values import PromptValue

__all__ = ["Conversation", "as_messages", "latest_user_turn", "split_turns"]

Conversation: TypeAlias = "Sequence[MessageLikeRepresentation] | str | PromptValue"
"""A conversation as LangChain takes it; a plain string is one user turn."""


def _items(conversation: Conversation, field: str) -> Sequence[MessageLikeRepresentation]:
    """The conversation's items, each still in its own form; refuses what is no conversation."""
    if isinstance(conversation, str):
        # Not a sequence of one-character turns, as iterating it would give: one user turn.
        return (HumanMessage(conversation),)
    if isinstance(conversation, Sequence):
        return conversation
    from langchain_core.prompt_values import PromptValue

    if isinstance(conversation, PromptValue):
        return conversation.to_messages()
    raise InvalidRequest(
        field,
        f"must be a list of messages (message objects, role/content dicts or (role, text) pairs) "
        f"or a string, not {type(conversation).__name__}",
    )


def _message(items: Sequence[MessageLikeRepresentation], index: int, field: str) -> BaseMessage:
    item = items[index]
    if isinstance(item, BaseMessage):
        return item
    try:
        return convert_to_messages([item])[0]
    except (ValueError, TypeError, NotImplementedError) as exc:  # pydantic's ValidationError is a ValueError
        # LangChain's first line says what is wrong; the rest is a link to its troubleshooting page.
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidRequest(f"{field}.{index}", f"is not a message: {reason}") from None


def as_messages(conversation: Conversation, field: str) -> Sequence[BaseMessage]:
    """Every item of the conversation as a message; a list of messages is returned as it is.

    Raises:
        InvalidRequest: naming ``field`` (``field.<index>`` for an item), when it is no conversation.
    """
    items = _items(conversation, field)
    if all(isinstance(item, BaseMessage) for item in items):
        return cast("Sequence[BaseMessage]", items)
    return [_message(items, i, field) for i in range(len(items))]


def _text(message: BaseMessage) -> str:
    # ``.text`` keeps only text content blocks (no thinking, reasoning or tool-use blocks);
    # thought markup inside the text itself goes too.
    return strip_thoughts(message.text)


def _latest(items: Sequence[MessageLikeRepresentation], field: str) -> tuple[int, BaseMessage] | None:
    for index in range(len(items) - 1, -1, -1):
        message = _message(items, index, field)
        if isinstance(message, HumanMessage):
            return index, message
    return None


def latest_user_turn(conversation: Conversation, field: str) -> tuple[int, BaseMessage] | None:
    """The latest user turn and its index, or ``None`` when there is none; only what it passes is read.

    Raises:
        InvalidRequest: naming ``field``, when it is no conversation or an item it reads is no message.
    """
    return _latest(_items(conversation, field), field)


def split_turns(
    conversation: Conversation, context_turns: int, *, field: str = "messages"
) -> tuple[str, tuple[str, ...]]:
    """Return the latest user turn's text and up to ``context_turns`` earlier turns as ``role: text``.

    Tool messages and assistant turns that only call tools are skipped: they are not conversation.

    Raises:
        InvalidRequest: naming ``field``: the conversation is empty, has no user turn, its latest
            user turn has no text (an empty string, or only images), or an item it reads is not a
            message. There is nothing to decide about then, and no decision is made.
    """
    if isinstance(conversation, str) and not conversation.strip():
        raise InvalidRequest(field, "is an empty string: a decision needs a user turn to read")
    items = _items(conversation, field)
    if not items:
        raise InvalidRequest(field, "is empty: a decision needs a user turn to read")
    found = _latest(items, field)
    if found is None:
        many = f"{len(items)} messages" if len(items) > 1 else "one message"
        raise InvalidRequest(
            field, f"has no user turn (of its {many}, none is the user's): a decision needs one to read"
        )
    index, message = found
    current = _text(message)
    if not current.strip():
        raise InvalidRequest(f"{field}.{index}", "the latest user turn has no text to read")
    earlier: list[str] = []
    for before in range(index - 1, -1, -1):
        if len(earlier) >= context_turns:
            break
        message = _message(items, before, field)
        if isinstance(message, (HumanMessage, AIMessage)):
            text = _text(message)
            if text:
                role = "user" if isinstance(message, HumanMessage) else "assistant"
                earlier.append(f"{role}: {text}")
    return current, tuple(reversed(earlier))
