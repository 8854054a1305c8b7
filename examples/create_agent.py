"""fastslow in a ``langchain.agents.create_agent`` agent: the model router and the policy gate as middleware.

Run it offline, with the embedded System-1 engine and the built-in example policy::

    .venv/bin/python examples/create_agent.py

Two conversations (threads of one checkpointer). The ``support`` route task picks the model for each turn: an
open-ended request (write an email) goes to the frontier model, a turn System 1 settles (a billing
question) to the small model. Every tool call the models propose passes the ``tool_safety``
check first: wiping a database is denied and the model is told why; reading a log runs, once
System 1 allows it or, where System 1 asks for review, once the person at the keyboard (here:
the script) approves it. Both models here are scripted stand-ins, so nothing leaves the machine; in a real agent
they are any LangChain chat models (``ChatOpenAI``, ``ChatAnthropic``, a local vLLM server, ...).

``make_agent(runtime)`` returns the compiled agent without a checkpointer, for LangGraph's server
(which brings its own); pass the process's one runtime there, so the policy store and engines
start once.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command

from fastslow import Runtime, build_runtime, get_settings
from fastslow.graphs.middleware import GATE_KEY, ROUTE_KEY, ModelRouterMiddleware, PolicyGateMiddleware

__all__ = ["ScriptedModel", "main", "make_agent"]

TURNS = (
    "Write a friendly apology email to a customer whose order arrived late",
    "I was charged twice for my subscription this month",
)


@tool
def read_file(path: str) -> str:
    """Read a file (a stand-in: returns canned text)."""
    return f"{path}: 2 payments of $20 on 2026-05-03, one refund pending"


@tool
def shell(command: str) -> str:
    """Run a shell command (a stand-in: nothing is run)."""
    return f"(pretended to run {command!r})"


class ScriptedModel(BaseChatModel):
    """A stand-in chat model: proposes its one tool call on a user turn, then answers from the result."""

    label: str
    proposes: dict[str, Any]
    """The tool call it proposes: ``{"name": ..., "args": {...}}``."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        del tools, kwargs
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        del stop, run_manager, kwargs
        last = messages[-1]
        if isinstance(last, HumanMessage):
            calls = [{**self.proposes, "id": f"{self.label}-{len(messages)}", "type": "tool_call"}]
            reply = AIMessage("", tool_calls=calls)
        elif isinstance(last, ToolMessage):
            reply = AIMessage(f"[{self.label}] {last.status}: {last.text}")
        else:
            reply = AIMessage(f"[{self.label}] done")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def make_agent(runtime: Runtime | None = None, *, checkpointer: BaseCheckpointSaver[Any] | None = None) -> Any:
    """The example agent over ``runtime`` (built from the settings when ``None``)."""
    runtime = runtime or build_runtime(get_settings())
    small = ScriptedModel(label="small", proposes={"name": "read_file", "args": {"path": "/srv/app/logs/billing.log"}})
    frontier = ScriptedModel(
        label="frontier", proposes={"name": "shell", "args": {"command": "rm -rf /var/lib/postgresql/data"}}
    )
    routes = ("billing", "technical", "account")
    agent: CompiledStateGraph[Any, Any, Any, Any] = create_agent(
        frontier,
        tools=[read_file, shell],
        middleware=[
            ModelRouterMiddleware(runtime.router, "support", models=dict.fromkeys(routes, small), frontier=frontier),
            # The call alone, as the policy's examples for the check are written.
            PolicyGateMiddleware(runtime.router, "tool_safety", context=False),
        ],
        checkpointer=checkpointer,
    )
    return agent


async def _demo(out: Any) -> None:
    runtime = build_runtime(get_settings())
    try:
        agent = make_agent(runtime, checkpointer=InMemorySaver())
        for thread, text in enumerate(TURNS):
            config: Any = {"configurable": {"thread_id": f"demo-{thread}"}}
            out.write(f"user: {text}\n")
            state = await agent.ainvoke({"messages": [HumanMessage(text)]}, config)
            route = state[ROUTE_KEY]
            out.write(f"  model: {route['model']} (route {route['route']}, {route['reason']})\n")
            while "__interrupt__" in state:
                request = state["__interrupt__"][0].value
                for action in request["action_requests"]:
                    out.write(f"  review asked: {action['description'].splitlines()[0]}; approved\n")
                decisions = [{"type": "approve"} for _ in request["action_requests"]]
                state = await agent.ainvoke(Command(resume={"decisions": decisions}), config)
            for gate in state.get(GATE_KEY, []):
                out.write(f"  tool call {gate['name']}: {gate['verdict']} by {gate['by']} (rule {gate['rule']})\n")
            out.write(f"  answer: {state['messages'][-1].text}\n")
    finally:
        await runtime.aclose()


def main() -> None:
    """Run the two-turn demo and print what was decided."""
    asyncio.run(_demo(sys.stdout))


if __name__ == "__main__":
    main()
