"""Draft, validate, escalate: a local worker drafts a JSON answer; only drafts that fail go to System 2.

    START -> draft --JSON--> validate --valid--> END            (produced_by "draft")
                  \\                  --invalid--> frontier -> END   (produced_by "frontier")
                   --no draft worker or it failed---^

The validator is deterministic (``schema_errors``), so what reaches the frontier model is exactly the
drafts a schema rejects. Asks no policy task.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import START, StateGraph, add_messages
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import TypedDict  # see pyproject.toml

from fastslow.router import Router

from ._common import Failed, GraphContext, Outcome, StepRecord, call_chat, step
from ._validate import schema_errors

__all__ = ["DRAFT", "FRONTIER", "TICKET_SCHEMA", "VALIDATE", "DraftState", "draft_graph"]

DRAFT: Final = "draft"
VALIDATE: Final = "validate"
FRONTIER: Final = "frontier"
_END: Final = "__end__"  # langgraph's END, as a literal for Command's type

TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "category": {"type": "string", "enum": ["billing", "technical", "account", "other"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 4},
        "summary": {"type": "string"},
    },
    "required": ["category", "priority", "summary"],
    "additionalProperties": False,
}
"""The default answer: a support ticket's category, priority (1 = urgent) and one-line summary."""

_PROMPT = (
    "Turn the user's request into one JSON object that matches this JSON schema exactly. Reply with "
    "the JSON object only.\n\nSchema:\n{schema}"
)


class DraftState(TypedDict, total=False):
    """Input ``messages`` (and optionally ``schema``); out come the answer and who produced it."""

    messages: Annotated[list[AnyMessage], add_messages]
    schema: dict[str, Any]
    """The answer's JSON schema; ``TICKET_SCHEMA`` when absent."""
    draft: Any
    """What the local worker wrote, valid or not."""
    validation_errors: list[str]
    answer: Any
    """The accepted answer; ``None`` when nobody produced a valid one."""
    produced_by: Literal["draft", "frontier"] | None
    model: str | None
    outcome: Outcome
    steps: Annotated[list[StepRecord], operator.add]


def _schema(state: DraftState) -> Mapping[str, Any]:
    return state.get("schema") or TICKET_SCHEMA


def _prompt(state: DraftState) -> str:
    return _PROMPT.format(schema=json.dumps(_schema(state), indent=1))


async def draft(state: DraftState, runtime: Runtime[GraphContext]) -> Command[Literal["validate", "frontier"]]:
    """The local draft worker; without one (or when it fails) the request goes straight to the frontier."""
    ctx = runtime.context
    if ctx.draft_model is None:
        skipped = Failed("needs_system2", "no local draft worker configured (system2.draft)")
        return Command(goto=FRONTIER, update={"steps": [step(DRAFT, skipped)]})
    result = await call_chat(
        ctx.chats, ctx.draft_model, _prompt(state), state.get("messages", []), schema=_schema(state)
    )
    if isinstance(result, Failed):
        return Command(goto=FRONTIER, update={"steps": [step(DRAFT, result)]})
    return Command(
        goto=VALIDATE, update={"draft": result.structured, "model": result.model, "steps": [step(DRAFT, result)]}
    )


async def validate(state: DraftState) -> Command[Literal["frontier", "__end__"]]:
    """The deterministic judge: keep a valid draft, escalate an invalid one with its errors."""
    errors = schema_errors(state.get("draft"), _schema(state))
    if errors:
        return Command(goto=FRONTIER, update={"validation_errors": errors})
    answer = state.get("draft")
    return Command(
        goto=_END,
        update={
            "answer": answer,
            "produced_by": "draft",
            "outcome": "answered",
            "validation_errors": [],
            "messages": [AIMessage(json.dumps(answer, ensure_ascii=False), name=DRAFT)],
        },
    )


async def frontier(state: DraftState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """System 2: write the answer, told why the draft was rejected; its answer is validated too."""
    messages = list(state.get("messages", []))
    errors = state.get("validation_errors", [])
    if "draft" in state and errors:
        drafted = json.dumps(state.get("draft"), ensure_ascii=False)
        messages.append(HumanMessage(f"A draft answer was rejected.\nDraft: {drafted}\nProblems: {'; '.join(errors)}"))
    result = await call_chat(
        runtime.context.chats, runtime.context.frontier_model, _prompt(state), messages, schema=_schema(state)
    )
    if isinstance(result, Failed):
        why = f" The draft was rejected: {'; '.join(errors)}." if errors else ""
        return {
            "messages": [AIMessage(result.note + why, name=FRONTIER)],
            "answer": None,
            "produced_by": None,
            "outcome": result.outcome,
            "steps": [step(FRONTIER, result)],
        }
    problems = schema_errors(result.structured, _schema(state))
    if problems:
        note = f"The frontier model's answer failed validation too: {'; '.join(problems)}"
        return {
            "messages": [AIMessage(note, name=FRONTIER)],
            "answer": None,
            "produced_by": None,
            "model": result.model,
            "outcome": "invalid_answer",
            "steps": [step(FRONTIER, result, note)],
        }
    return {
        "messages": [AIMessage(json.dumps(result.structured, ensure_ascii=False), name=FRONTIER)],
        "answer": result.structured,
        "produced_by": "frontier",
        "model": result.model,
        "outcome": "answered",
        "steps": [step(FRONTIER, result)],
    }


def draft_graph(router: Router | None = None) -> StateGraph[DraftState, GraphContext, DraftState, DraftState]:
    """The draft -> validate -> escalate graph, uncompiled; run it with ``context=GraphContext(...)``.

    ``router`` is accepted for a uniform factory signature; this graph asks no policy task.
    """
    del router
    graph = StateGraph(DraftState, context_schema=GraphContext)
    graph.add_node(DRAFT, draft)
    graph.add_node(VALIDATE, validate)
    graph.add_node(FRONTIER, frontier)
    graph.add_edge(START, DRAFT)
    graph.add_edge(FRONTIER, "__end__")
    return graph
