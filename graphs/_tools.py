"""A tool-using agent whose every tool call passes the policy gate first.

    START -> agent --tool calls--> gate --allowed (Send)--> tools -> agent
                                        --all denied------> agent
                   --no tool calls--> END

The gate (``fastslow.router.policy_gate_node``) answers denied calls with a refusal ``ToolMessage``, so no
call is left orphaned and the agent can explain or choose another action. Needs the policy task
``tool_safety`` (kind ``check``), whose rules judge each call rendered as one line,
``name: key=value, ...`` (see ``docs/policies.md``).
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, StateGraph, add_messages
from langgraph.prebuilt import ToolNode, ToolRuntime
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import TypedDict  # see pyproject.toml

from fastslow.router import Router, policy_gate_node
from fastslow.router.engine_api import ToolSpec

from ._common import Failed, GraphContext, Outcome, StepRecord, ai_message, call_chat, step

__all__ = [
    "AGENT",
    "DEMO_TOOLS",
    "GATE",
    "MAX_TOOL_ROUNDS",
    "TOOLS",
    "TOOL_SAFETY_TASK",
    "ToolAgentState",
    "delete_file",
    "list_files",
    "read_file",
    "tool_agent_graph",
]

TOOL_SAFETY_TASK = "tool_safety"
AGENT: Final = "agent"
GATE: Final = "gate"
TOOLS: Final = "tools"
_END: Final = "__end__"  # langgraph's END, as a literal for Command's type
MAX_TOOL_ROUNDS = 6
"""Rounds of tool calls per user turn; the last round asks for an answer without tools."""
_MAX_READ_CHARS = 20_000

_PROMPT = (
    "You are a careful file assistant working in a sandbox directory. Use the tools to list, read "
    "or delete files when the user asks. Paths are relative to the sandbox. If a tool call is "
    "refused by policy, do not retry it: tell the user why it was refused."
)


# Tool signatures type the runtime as ``ToolRuntime[Any, Any]``: LangChain builds a pydantic model of
# each signature, and ``GraphContext`` holds a protocol pydantic can neither validate nor serialise.


def _sandbox(runtime: ToolRuntime[Any, Any]) -> Path:
    context: GraphContext = runtime.context
    if context.sandbox is None:
        raise ValueError("no sandbox directory is configured")
    return context.sandbox.resolve()


def _inside(runtime: ToolRuntime[Any, Any], path: str) -> Path:
    """``path`` resolved inside the sandbox; links and ``..`` cannot leave it."""
    root = _sandbox(runtime)
    target = (root / path).resolve()
    if target == root or not target.is_relative_to(root):
        raise ValueError(f"{path!r} is not a file inside the sandbox")
    return target


@tool
def list_files(runtime: ToolRuntime[Any, Any]) -> str:
    """List the files in the sandbox, one relative path a line."""
    root = _sandbox(runtime)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return "\n".join(files) or "(the sandbox is empty)"


@tool
def read_file(path: str, runtime: ToolRuntime[Any, Any]) -> str:
    """Read a text file in the sandbox.

    Args:
        path: the file's path relative to the sandbox.
    """
    return _inside(runtime, path).read_text(encoding="utf-8", errors="replace")[:_MAX_READ_CHARS]


@tool
def delete_file(path: str, runtime: ToolRuntime[Any, Any]) -> str:
    """Delete a file in the sandbox.

    Args:
        path: the file's path relative to the sandbox.
    """
    target = _inside(runtime, path)
    target.unlink()
    return f"deleted {path}"


DEMO_TOOLS: tuple[BaseTool, ...] = (list_files, read_file, delete_file)


def _spec(t: BaseTool) -> ToolSpec:
    # The OpenAI form leaves out injected arguments (the runtime) and pydantic's titles.
    function = convert_to_openai_tool(t)["function"]
    return ToolSpec(
        name=function["name"], description=function.get("description", ""), parameters=function["parameters"]
    )


_SPECS = tuple(_spec(t) for t in DEMO_TOOLS)


class ToolAgentState(TypedDict, total=False):
    """The conversation, the gate's verdicts and how the run ended."""

    messages: Annotated[list[AnyMessage], add_messages]
    gate: Annotated[list[dict[str, Any]], operator.add]
    """Every gate verdict: ``tool_call_id``, ``verdict``, ``rule`` and ``by`` (System 1, System 2 or a person)."""
    outcome: Outcome
    steps: Annotated[list[StepRecord], operator.add]


def _rounds(messages: list[AnyMessage]) -> int:
    """Tool-calling AI turns since the latest user message."""
    rounds = 0
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        if isinstance(message, AIMessage) and message.tool_calls:
            rounds += 1
    return rounds


async def agent(state: ToolAgentState, runtime: Runtime[GraphContext]) -> Command[Literal["gate", "__end__"]]:
    """The agent: asks its model for tool calls or a final answer."""
    messages = state.get("messages", [])
    last_round = _rounds(messages) >= MAX_TOOL_ROUNDS - 1
    tools = () if last_round else _SPECS
    ctx = runtime.context
    result = await call_chat(ctx.chats, ctx.agent_model, _PROMPT, messages, tools=tools)
    if isinstance(result, Failed):
        failed = {"messages": [AIMessage(result.note, name=AGENT)], "outcome": result.outcome}
        return Command(goto=_END, update=failed | {"steps": [step(AGENT, result)]})
    message = ai_message(result, AGENT)
    update: dict[str, Any] = {"messages": [message], "steps": [step(AGENT, result)]}
    if message.tool_calls:
        return Command(goto=GATE, update=update)
    return Command(goto=_END, update=update | {"outcome": "step_limit" if last_round else "answered"})


def tool_agent_graph(router: Router) -> StateGraph[ToolAgentState, GraphContext, ToolAgentState, ToolAgentState]:
    """The gated tool agent with the demo sandbox tools, uncompiled; run it with ``context=GraphContext(...)``.

    Use a checkpointer when the policy has ``review`` bands: the gate pauses with ``interrupt()``.
    """
    graph = StateGraph(ToolAgentState, context_schema=GraphContext)
    graph.add_node(AGENT, agent)
    graph.add_node(
        GATE, policy_gate_node(router, TOOL_SAFETY_TASK, tools=TOOLS, agent=AGENT), destinations=(TOOLS, AGENT)
    )
    # Tool failures (a missing file, a path outside the sandbox) go back to the model as error results.
    graph.add_node(TOOLS, ToolNode(list(DEMO_TOOLS), handle_tool_errors=True))
    graph.add_edge(START, AGENT)
    graph.add_edge(TOOLS, AGENT)
    return graph
