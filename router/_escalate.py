"""Asking System 2 the same typed question System 1 was unsure of.

The frontier model answers with structured output constrained to the valid options (a JSON schema
with an ``enum``), never free text parsed by a regular expression.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from ._breaker import failure_log_level
from ._chat import ChatEngine
from ._errors import EngineError, failure_summary
from ._questions import Choice, Noul, Question, Score, State
from ._sanitize import strip_thoughts

__all__ = ["System2Answer", "ask_system2", "option_schema"]

log = logging.getLogger("fastslow.router")

_SYSTEM = (
    "You answer one typed question about the state the user provides. Choose exactly one of the "
    "allowed answers and reply with JSON matching the schema. Do not answer anything else."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class System2Answer:
    option: str | None
    """The chosen option, or ``None`` when the model could not be asked or answered outside the options."""
    model: str
    detail: str = ""
    cost_usd: float | None = None


def option_schema(question: Question) -> dict[str, Any]:
    """JSON schema whose only valid values are the question's options."""
    return {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": list(question.options)}},
        "required": ["answer"],
        "additionalProperties": False,
    }


def _describe(question: Question) -> str:
    lines = [question.instructions or ""]
    if isinstance(question, Noul):
        lines.append(f"yes: {question.yes or 'the statement holds'}")
        lines.append(f"no: {question.no or 'the statement does not hold'}")
    elif isinstance(question, Choice):
        lines.extend(f"{name}: {desc}" if desc else name for name, desc in question.criteria.items())
    elif isinstance(question, Score):
        lines.extend(f"{i}: {level}" for i, level in enumerate(question.levels))
    return "\n".join(line for line in lines if line)


CONTEXT_TURNS = 8
"""The caller's most recent conversation turns System 2 reads before the question."""


def conversation(context: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The caller's last text turns, as plain user and assistant messages.

    Only text reaches System 2. Another model's thinking blocks and reasoning items (whose
    signatures only that model can check), tool calls without their results (which a provider
    refuses), tool output and a caller's own system messages stay out; thought markup inside the
    text is stripped. A long agent loop sends a bounded window, not its whole history.
    """
    turns: list[BaseMessage] = []
    for message in context:
        if isinstance(message, (HumanMessage, AIMessage)) and (text := strip_thoughts(message.text)):
            turns.append(HumanMessage(text) if isinstance(message, HumanMessage) else AIMessage(text))
    return turns[-CONTEXT_TURNS:]


def state_text(state: State) -> str:
    """A state as one text (System 2's prompt, a span's opted-in state): the text itself, or its fields as JSON."""
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, indent=1)


async def ask_system2(
    chat: ChatEngine,
    question: Question,
    state: State,
    *,
    context: Sequence[BaseMessage] = (),
    timeout_s: float | None = None,
) -> System2Answer:
    """Ask ``chat`` to answer ``question`` about ``state``; errors become an answer of ``None``."""
    prompt = f"State:\n{state_text(state)}\n\nQuestion:\n{_describe(question)}\n\nAllowed answers: " + ", ".join(
        question.options
    )
    messages: list[BaseMessage] = [SystemMessage(_SYSTEM), *conversation(context), HumanMessage(prompt)]
    try:
        # The SDKs' timeouts are per read: a deadline over the whole call is ours to keep.
        async with asyncio.timeout(timeout_s):
            result = await chat.complete(messages, schema=option_schema(question), timeout_s=timeout_s)
    except TimeoutError:
        return System2Answer(option=None, model=chat.model, detail=f"System 2 gave no answer within {timeout_s:g} s")
    except EngineError as exc:
        # The provider's own message stays in the log (see failure_summary).
        log.log(failure_log_level(exc), "System 2 (%s) could not answer: %s", chat.model, exc)
        return System2Answer(option=None, model=chat.model, detail=f"System 2 {failure_summary(exc)}")
    structured = result.structured
    option = structured.get("answer") if isinstance(structured, dict) else None
    if option not in question.options:
        return System2Answer(
            option=None,
            model=result.model,
            detail=f"System 2 answered outside the options: {option!r}",
            cost_usd=result.cost_usd,
        )
    return System2Answer(option=option, model=result.model, cost_usd=result.cost_usd)
