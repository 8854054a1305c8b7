"""Support triage: System 1 routes each request to a specialised agent; the rest go to a frontier model.

    START -> route --billing--> billing ---> END
                  --technical-> technical -> END
                  --account---> account ---> END
                  --(escalated, open-ended, none of these)--> frontier -> END

Needs the policy task ``support`` (kind ``route``) with routes ``billing``, ``technical`` and
``account`` (and, optionally, a none-of-these option).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph, add_messages
from langgraph.runtime import Runtime
from typing_extensions import TypedDict  # see pyproject.toml

from fastslow.router import ConfigError, Router, RouteTask, router_node

from ._common import Failed, GraphContext, Outcome, StepRecord, ai_message, call_chat, step

__all__ = [
    "ACCOUNT",
    "BILLING",
    "FRONTIER",
    "ROUTE",
    "SUPPORT_TASK",
    "TECHNICAL",
    "SupportState",
    "support_graph",
]

SUPPORT_TASK = "support"
ROUTE = "route"
BILLING = "billing"
TECHNICAL = "technical"
ACCOUNT = "account"
FRONTIER = "frontier"

_PROMPTS = {
    BILLING: (
        "You are the billing specialist of a software company's support desk. You handle charges, "
        "invoices, refunds and payment methods. Answer the customer's latest message in a few short "
        "sentences; say what you will do and what you need from them."
    ),
    TECHNICAL: (
        "You are the technical support specialist of a software company. You handle bugs, crashes, "
        "errors and how-to questions. Answer the customer's latest message with concrete next steps."
    ),
    ACCOUNT: (
        "You are the account specialist of a software company's support desk. You handle sign-in, "
        "passwords, profile changes and closing accounts. Never ask for a password. Answer briefly."
    ),
    FRONTIER: (
        "You are a senior support agent. The request below could not be routed to a specialist, or "
        "it needs open-ended work. Answer it helpfully and completely."
    ),
}


class SupportState(TypedDict, total=False):
    """The conversation, the routing decision and how the run ended."""

    messages: Annotated[list[AnyMessage], add_messages]
    route: str | None
    """The route System 1 (or System 2) chose; ``None`` when escalated to the frontier agent."""
    decision: dict[str, Any]
    """The decision record the router node wrote to state."""
    outcome: Outcome
    steps: Annotated[list[StepRecord], operator.add]


async def _answer(node: str, state: SupportState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    ctx = runtime.context
    ref = ctx.frontier_model if node == FRONTIER else ctx.agent_model
    result = await call_chat(ctx.chats, ref, _PROMPTS[node], state.get("messages", []))
    if isinstance(result, Failed):
        message = AIMessage(result.note, name=node)
        return {"messages": [message], "outcome": result.outcome, "steps": [step(node, result)]}
    return {"messages": [ai_message(result, node)], "outcome": "answered", "steps": [step(node, result)]}


async def billing(state: SupportState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """The billing specialist."""
    return await _answer(BILLING, state, runtime)


async def technical(state: SupportState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """The technical specialist."""
    return await _answer(TECHNICAL, state, runtime)


async def account(state: SupportState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """The account specialist."""
    return await _answer(ACCOUNT, state, runtime)


async def frontier(state: SupportState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """The frontier agent, for escalated and open-ended requests."""
    return await _answer(FRONTIER, state, runtime)


_AGENTS = {BILLING: billing, TECHNICAL: technical, ACCOUNT: account}


def _routes(router: Router) -> dict[str, str]:
    """Route name -> node; a none-of-these option that System 2 might still pick goes to the frontier."""
    task = router.policy.tasks.get(SUPPORT_TASK)
    if not isinstance(task, RouteTask):
        raise ConfigError(f"the support graph needs a route task {SUPPORT_TASK!r}", key=f"tasks.{SUPPORT_TASK}")
    unknown = sorted(set(task.routes) - set(_AGENTS) - {task.none_option})
    if unknown:
        raise ConfigError(
            f"the support graph has no agent for routes {unknown}; routes: {sorted(_AGENTS)}",
            key=f"tasks.{SUPPORT_TASK}.routes",
        )
    routes = {name: name for name in _AGENTS}
    if task.none_option:
        routes[task.none_option] = FRONTIER
    return routes


def support_graph(router: Router) -> StateGraph[SupportState, GraphContext, SupportState, SupportState]:
    """The support triage graph, uncompiled; run it with ``context=GraphContext(...)``.

    Raises:
        ConfigError: the policy has no ``support`` route task, or one with routes no agent handles.
    """
    graph = StateGraph(SupportState, context_schema=GraphContext)
    graph.add_node(
        ROUTE,
        router_node(router, SUPPORT_TASK, routes=_routes(router), escalate_to=FRONTIER),
        destinations=(*_AGENTS, FRONTIER),
    )
    for name, node in {**_AGENTS, FRONTIER: frontier}.items():
        graph.add_node(name, node)
        graph.add_edge(name, END)
    graph.add_edge(START, ROUTE)
    return graph
