"""Ready agent graphs built from the router's nodes and real ``ChatEngine`` calls.

``GRAPHS`` names each graph with its factory and the policy tasks it needs; ``run_graph`` runs one
over a single user message and returns the final state as JSON-able data (the CLI's
``fastslow graph list`` / ``fastslow graph run``). Every graph runs offline: with no frontier model
configured, System-2 steps are ``skipped`` and the run ends with ``outcome: "needs_system2"`` and a message
saying so: System 1's part is done, and the next step needs a System-2 model.
Given System-1 engines, the tool agent's offline planner proposes its calls instead, so the policy
gate still judges real calls offline (``_tools``).

``resume_reviewed`` resumes a thread paused at a policy gate once the reviews it waits on are
settled in the review queue (``resume_value`` is the value each gate takes; docs/reviews.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import StateGraph

from fastslow.router import ChatSource, ConfigError, EngineSource, Router, resume_value

from ._common import NO_FRONTIER, GraphContext, Outcome, StepRecord, StepStatus, call_text, message_record
from ._draft import TICKET_SCHEMA, DraftState, draft_graph
from ._reviews import ReviewLookup, ReviewSource, WaitingReview, resume_reviewed, waiting_reviews
from ._support import SUPPORT_TASK, SupportState, support_graph
from ._tools import (
    DEMO_FILES,
    DEMO_TOOLS,
    TOOL_SAFETY_TASK,
    ToolAgentContext,
    ToolAgentState,
    demo_sandbox,
    tool_agent_graph,
)
from ._validate import schema_errors

__all__ = [
    "DEMO_FILES",
    "DEMO_TOOLS",
    "GRAPHS",
    "NO_FRONTIER",
    "SUPPORT_TASK",
    "TICKET_SCHEMA",
    "TOOL_SAFETY_TASK",
    "DraftState",
    "GraphContext",
    "GraphName",
    "GraphSpec",
    "Outcome",
    "ReviewLookup",
    "ReviewSource",
    "StepRecord",
    "StepStatus",
    "SupportState",
    "TaskKind",
    "ToolAgentContext",
    "ToolAgentState",
    "WaitingReview",
    "call_text",
    "demo_sandbox",
    "draft_graph",
    "message_record",
    "resume_reviewed",
    "resume_value",
    "run_graph",
    "schema_errors",
    "support_graph",
    "tool_agent_graph",
    "waiting_reviews",
]

GraphName: TypeAlias = Literal["support-triage", "guarded-tools", "draft-validate"]
TaskKind: TypeAlias = Literal["route", "classify", "check"]


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphSpec:
    """A graph the CLI can list and run."""

    name: GraphName
    description: str
    factory: Callable[[Router], StateGraph[Any, GraphContext, Any, Any]]
    """Builds the uncompiled graph; compile it with your checkpointer and run it with ``context=GraphContext``."""
    tasks: Mapping[str, TaskKind]
    """Policy tasks the graph asks, by name, with the kind each must be."""
    tools: bool = False
    """A tool agent: its tools work in a sandbox (``run_graph`` makes a demo one when given none), and
    it takes a ``ToolAgentContext``, whose System-1 engine its offline planner asks."""


GRAPHS: dict[GraphName, GraphSpec] = {
    "support-triage": GraphSpec(
        name="support-triage",
        description="Route a support request to a billing, technical or account agent; escalate the rest.",
        factory=support_graph,
        tasks={SUPPORT_TASK: "route"},
    ),
    "guarded-tools": GraphSpec(
        name="guarded-tools",
        description="A file agent whose every tool call passes the policy gate before it runs.",
        factory=tool_agent_graph,
        tasks={TOOL_SAFETY_TASK: "check"},
        tools=True,
    ),
    "draft-validate": GraphSpec(
        name="draft-validate",
        description="A local worker drafts a JSON answer; drafts that fail the schema go to the frontier model.",
        factory=draft_graph,
        tasks={},
    ),
}


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseMessage):
        return message_record(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


async def run_graph(
    name: GraphName,
    text: str,
    *,
    router: Router,
    chats: ChatSource,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    thread_id: str | None = None,
    draft_model: str | None = None,
    sandbox: Path | None = None,
    engines: EngineSource | None = None,
) -> dict[str, Any]:
    """Run graph ``name`` over one user message and return its final state as JSON-able data.

    Args:
        text: the user's message.
        router: the router the graph's policy nodes ask.
        chats: where System-2 engines come from (``fastslow.engines.chat.Frontier``).
        checkpointer: keeps the conversation under ``thread_id`` (a fresh id when ``None``), so
            a later run continues it and a paused gate review can be resumed.
        draft_model: the draft worker's model reference (``settings.system2.draft``).
        sandbox: the directory the tool agent's demo tools work in; when ``None``, a temporary
            one holding ``DEMO_FILES``, removed after the run.
        engines: where System-1 engines come from (the runtime's ``EnginePool``): its default
            engine answers the tool agent's offline planner when no chat model is configured.
            ``None``: no offline planner.

    Returns:
        The state's values (messages as ``{"type", "content", ...}`` dicts), plus ``graph``,
        ``thread_id``, ``sandbox`` when the run worked in a demo sandbox and, when the run
        paused for a person, ``interrupts``.

    Raises:
        ConfigError: ``name`` is not a graph, or the policy lacks a task the graph needs.
    """
    spec = GRAPHS.get(name)
    if spec is None:
        raise ConfigError(f"no graph {name!r}; graphs: {', '.join(GRAPHS)}", key="graph")
    policy = router.policy
    for task, kind in spec.tasks.items():
        found = policy.tasks.get(task)
        if found is None or found.kind != kind:
            raise ConfigError(f"graph {name!r} needs a {kind} task {task!r} in the policy", key=f"tasks.{task}")
    app = spec.factory(router).compile(checkpointer=checkpointer)
    thread = thread_id or uuid.uuid4().hex
    out: dict[str, Any] = {"graph": name, "thread_id": thread}
    with ExitStack() as stack:
        context = GraphContext(chats=chats, draft_model=draft_model, sandbox=sandbox)
        if spec.tools:
            if sandbox is None:
                sandbox = stack.enter_context(demo_sandbox())
                out["sandbox"] = f"a temporary demo folder holding {', '.join(DEMO_FILES)}, removed after the run"
            system1 = engines.engine_for(None, policy) if engines is not None else None
            context = ToolAgentContext(chats=chats, draft_model=draft_model, sandbox=sandbox, system1=system1)
        state = await app.ainvoke(
            {"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": thread}}, context=context
        )
    for key, value in state.items():
        if key == "__interrupt__":
            out["interrupts"] = [{"id": i.id, "value": _jsonable(i.value)} for i in value]
        else:
            out[key] = _jsonable(value)
    return out
