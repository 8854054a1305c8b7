"""A tool-using agent whose every tool call passes the policy gate first.

    START -> agent --tool calls--> gate --allowed (Send)--> tools -> agent
                                        --all denied------> agent
                   --no tool calls--> END

The gate (``fastslow.router.policy_gate_node``) answers denied calls with a refusal ``ToolMessage``, so no
call is left orphaned and the agent can explain or choose another action. Needs the policy task
``tool_safety`` (kind ``check``), whose rules judge each call rendered as one line,
``name: key=value, ...`` (see ``docs/policies.md``).

With no chat model configured and a System-1 engine in the context (a ``ToolAgentContext``), an
offline planner stands in for the agent's model, and says so: System 1 answers which demo tool the
request needs (a ``Choice`` over the tools' descriptions, or none of them), and the planner proposes
that tool for each file the request names, or for every file in the sandbox when it names none. The
gate judges those calls as it would a model's; the run then ends with what the gate decided and
what the tools did, and the usual "no frontier model configured" outcome, since no model can answer
in words.
"""

from __future__ import annotations

import asyncio
import operator
import re
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, StateGraph, add_messages
from langgraph.prebuilt import ToolNode, ToolRuntime
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import TypedDict  # see pyproject.toml

from fastslow.router import Answer, Choice, EngineError, InvalidRequest, Router, policy_gate_node
from fastslow.router.engine_api import DecisionEngine, ToolSpec

from ._common import Failed, GraphContext, Outcome, StepRecord, ai_message, call_chat, call_text, step

__all__ = [
    "AGENT",
    "DEMO_FILES",
    "DEMO_TOOLS",
    "GATE",
    "MAX_TOOL_ROUNDS",
    "OFFLINE_PLANNER",
    "PLANNER_MIN_CONFIDENCE",
    "TOOLS",
    "TOOL_SAFETY_TASK",
    "ToolAgentContext",
    "ToolAgentState",
    "delete_file",
    "demo_sandbox",
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
OFFLINE_PLANNER = "offline planner"
"""How the stand-in for the agent's model names itself in its messages and steps."""
PLANNER_MIN_CONFIDENCE = 0.5
"""The least probability System 1 must give one tool for the offline planner to propose it."""
_PLANNER_TIMEOUT_S = 30.0
_PLANNER_CALL_ID = "offline_"
_NO_TOOL = "none"
_FILE_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{1,7})(?![\w/-])")
"""A file's name or relative path in a request: a final part with an extension (``notes.txt``,
``../secret.txt``); not ``e.g`` or ``1.5``."""
DEMO_FILES: dict[str, str] = {
    "notes.txt": "Standup: ship the router on Friday; Ana reviews the policy file.\n",
    "report.csv": "month,tickets,escalated\nMay,412,37\n",
    "todo.md": "- rotate the API keys\n- answer the billing tickets\n",
}
"""What ``demo_sandbox`` holds."""

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
_TOOL_CHOICE = Choice(
    instructions="Which file tool does this request need?",
    criteria={
        **{spec.name: spec.description.split("\n", 1)[0] for spec in _SPECS},
        _NO_TOOL: "None of these: the request asks for no file operation.",
    },
)
"""What the offline planner asks System 1: the demo tools by their descriptions' first lines, or none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolAgentContext(GraphContext):
    """A ``GraphContext`` that also gives the tool agent's offline planner a System-1 engine."""

    system1: DecisionEngine | None = None
    """Asked which demo tool a request needs when no chat model is configured (``None``: no planner).
    Not a ``GraphContext`` field: LangGraph's server builds its context schema from those, and an
    engine is neither JSON nor anything a caller should set."""


@contextmanager
def demo_sandbox() -> Iterator[Path]:
    """A temporary sandbox holding ``DEMO_FILES``, removed on exit, for a demo run of the tool agent."""
    with tempfile.TemporaryDirectory(prefix="fastslow-sandbox-") as folder:
        root = Path(folder)
        for name, text in DEMO_FILES.items():
            (root / name).write_text(text, encoding="utf-8")
        yield root


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


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the offline planner proposes (maybe nothing), and its account of why, for people."""

    calls: list[dict[str, Any]]
    said: str


def _paths(request: str, sandbox: Path | None) -> tuple[list[str], str]:
    """The paths to call a path tool with, and which they are: the files the request names, else every file."""
    files = [] if sandbox is None else sorted(str(p.relative_to(sandbox)) for p in sandbox.rglob("*") if p.is_file())
    by_name: dict[str, list[str]] = {}
    for file in files:
        by_name.setdefault(Path(file).name, []).append(file)
    named: list[str] = []
    for token in _FILE_NAME.findall(request):
        # A sandbox file by its path or its (unique) name; anything else as written, for the tool to refuse.
        found = [token] if token in files else by_name.get(token, [token])
        named.append(found[0] if len(found) == 1 else token)
    if named:
        paths = list(dict.fromkeys(named))
        return paths, f"the file{'s' if len(paths) > 1 else ''} the request names ({', '.join(paths)})"
    if sandbox is None:
        return [], "no sandbox is configured, so there are no files"
    return files, f"each file in the sandbox, as the request names none ({len(files)} files)"


async def _plan_offline(engine: DecisionEngine, request: str, sandbox: Path | None) -> _Plan:
    """Ask System 1 which demo tool ``request`` needs and propose it, as ``_Plan`` says."""
    try:
        async with asyncio.timeout(_PLANNER_TIMEOUT_S):
            reply = await engine.decide(request, {"tool": _TOOL_CHOICE})
    except (TimeoutError, EngineError, InvalidRequest) as exc:
        return _Plan([], f"System 1 could not say which tool the request needs ({exc or 'no answer in time'})")
    answer = reply.answers.get("tool")
    if not isinstance(answer, Answer):
        return _Plan([], "System 1 could not say which tool the request needs")
    tool, p = answer.top, answer.confidence
    chose = f"System 1 ({answer.engine} engine) chose {tool!r} for this request (p={p:.2f})"
    if tool == _NO_TOOL:
        return _Plan([], f"{chose}: no file tool to call")
    if p < PLANNER_MIN_CONFIDENCE:
        return _Plan([], f"{chose}, too unsure (below {PLANNER_MIN_CONFIDENCE}) to propose a call")
    if tool == list_files.name:
        paths, which = [""], "the sandbox"
    else:
        paths, which = _paths(request, sandbox)
        if not paths:
            return _Plan([], f"{chose}, but {which} to call it with")
    turn = uuid.uuid4().hex[:8]  # call ids stay unique over a conversation's turns
    calls = [
        {"id": f"{_PLANNER_CALL_ID}{turn}_{i}", "name": tool, "args": {"path": at} if at else {}, "type": "tool_call"}
        for i, at in enumerate(paths, 1)
    ]
    return _Plan(calls, f"{chose}; proposing {tool} for {which}. The policy gate judges each call before it runs")


def _judged(messages: Sequence[AnyMessage], gate: Sequence[dict[str, Any]]) -> str:
    """What became of the offline planner's calls: each one's verdict, and what the tool returned."""
    turn = _since_request(messages)
    calls = [c for m in turn if isinstance(m, AIMessage) for c in m.tool_calls]
    verdicts = {v["tool_call_id"]: v for v in gate}
    results = {m.tool_call_id: m for m in turn if isinstance(m, ToolMessage)}
    lines: list[str] = []
    for call in calls:
        call_id = call["id"] or ""
        if not call_id.startswith(_PLANNER_CALL_ID):
            continue
        verdict = verdicts.get(call_id)
        judged = f"{verdict['verdict']} by {verdict['by']} (rule {verdict['rule']})" if verdict else "not judged"
        result = results.get(call_id)
        if result is not None and verdict is not None and verdict["verdict"] == "allow":
            text = " ".join(str(result.content).split())
            judged += f"; the tool {'failed' if result.status == 'error' else 'returned'}: {text[:120]}"
        lines.append(f"- {call_text(call)}: {judged}")
    return "The policy gate judged the offline planner's calls:\n" + "\n".join(lines)


def _since_request(messages: Sequence[AnyMessage]) -> Sequence[AnyMessage]:
    """The messages after the latest user message: this turn's."""
    starts = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    return messages[starts[-1] + 1 :] if starts else messages


def _latest_request(messages: Sequence[AnyMessage]) -> str:
    return next((m.text for m in reversed(messages) if isinstance(m, HumanMessage)), "")


async def _offline(
    state: ToolAgentState, engine: DecisionEngine, sandbox: Path | None, failed: Failed
) -> Command[Literal["gate", "__end__"]]:
    """The agent's turn with no chat model: the offline planner proposes calls, or the run ends saying what happened."""
    messages = state.get("messages", [])
    if _rounds(messages) == 0:
        plan = await _plan_offline(engine, _latest_request(messages), sandbox)
        said = f"{OFFLINE_PLANNER.capitalize()} (no chat model is configured; no model wrote this): {plan.said}."
        if plan.calls:
            record: StepRecord = {"node": AGENT, "model": None, "status": "done", "detail": said, "cost_usd": None}
            update = {"messages": [AIMessage(said, name=AGENT, tool_calls=plan.calls)], "steps": [record]}
            return Command(goto=GATE, update=update)
    else:
        said = _judged(messages, state.get("gate", []))
    said = f"{said}\n\n{failed.note}"
    record = {"node": AGENT, "model": None, "status": "skipped", "detail": said, "cost_usd": None}
    ended = {"messages": [AIMessage(said, name=AGENT)], "outcome": failed.outcome, "steps": [record]}
    return Command(goto=_END, update=ended)


async def agent(state: ToolAgentState, runtime: Runtime[GraphContext]) -> Command[Literal["gate", "__end__"]]:
    """The agent: asks its model for tool calls or a final answer (the offline planner stands in for none)."""
    messages = state.get("messages", [])
    last_round = _rounds(messages) >= MAX_TOOL_ROUNDS - 1
    tools = () if last_round else _SPECS
    ctx = runtime.context
    result = await call_chat(ctx.chats, ctx.agent_model, _PROMPT, messages, tools=tools)
    if isinstance(result, Failed):
        system1 = ctx.system1 if isinstance(ctx, ToolAgentContext) else None
        if result.outcome == "needs_system2" and system1 is not None:
            return await _offline(state, system1, ctx.sandbox, result)
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
