"""What the review tests share: a policy whose bands make every answer a review or an allow, and a
small agent graph that proposes one tool call and pauses at ``policy_gate_node`` for review.

System 1 is a script (``scripted_router``), so the verdicts are certain without training anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from fastslow.policies import load_policy
from fastslow.router import Router, policy_gate_node

from fakes.scripted import Chats, OneEngine, ScriptedEngine

__all__ = ["REVIEW_POLICY", "gated_graph", "scripted_router"]

REVIEW_POLICY = """\
version: 1
tasks:
  review_me:
    kind: check
    rules:
      risky:
        instructions: Could this call do harm?
        allow_at: 0.0
        deny_at: 1.0
  let_through:
    kind: check
    rules:
      risky:
        instructions: Could this call do harm?
        allow_at: 1.0
        deny_at: 1.0
"""
"""``review_me`` reviews every answer; ``let_through`` allows every answer."""


def scripted_router(policy_file: Path, harm: float = 0.6) -> Router:
    """A router over ``policy_file`` whose System 1 is ``harm`` sure of harm (0.6: ``review_me``'s band)."""
    policy = load_policy(policy_file)
    answer = {"yes": harm, "no": 1 - harm}
    return Router(lambda: policy, OneEngine(ScriptedEngine(lambda *_: answer)), Chats(None))


def gated_graph(router: Router, tool: BaseTool, call: Mapping[str, Any], *, task: str = "review_me") -> Any:
    """agent -> gate -> tools: the agent proposes ``call`` (``{"name", "args", "id"}``) once, then says "done"."""
    turns = iter([AIMessage("", tool_calls=[dict(call)])])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [next(turns, AIMessage("done"))]}

    graph: StateGraph[MessagesState, Any, MessagesState, MessagesState] = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("gate", policy_gate_node(router, task), destinations=("tools", "agent"))
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", lambda s: "gate" if s["messages"][-1].tool_calls else END, ["gate", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())
