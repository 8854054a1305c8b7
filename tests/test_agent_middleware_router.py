"""``ModelRouterMiddleware`` in real ``create_agent`` agents: a model per user turn, no thoughts in state.

Also the configuration errors of both middlewares, and the example agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.types import Command
from pydantic import SecretStr

from fastslow.engines.chat import Frontier
from fastslow.graphs.middleware import (
    GATE_KEY,
    ROUTE_KEY,
    ModelRouterMiddleware,
    PolicyGateMiddleware,
    without_thoughts,
)
from fastslow.policies import parse_policy
from fastslow.router import ConfigError, Router
from fastslow.router.settings import System2Settings

from fakes.canary import CANARY, INLINE_FORMS, ThinkingChat
from fakes.chat_models import Answered, ScriptedChatModel, call, counted_router, keyword_script
from fakes.openai_server import ScriptedServer, openai_server
from fakes.scripted import OneEngine, ScriptedEngine

REPO = Path(__file__).resolve().parent.parent

looked_up: list[str] = []


@tool
def lookup(query: str) -> str:
    """Look something up in the order system."""
    looked_up.append(query)
    return f"found {query}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    looked_up.clear()


def _models(log: Answered, **scripts: list[AIMessage]) -> dict[str, ScriptedChatModel]:
    return {
        name: ScriptedChatModel(label=name, script=scripts.get(name, []), log=log)
        for name in ("billing", "technical", "frontier")
    }


def _agent(router: Router, models: dict[str, ScriptedChatModel], checkpointer: Any, *, gate: bool = False) -> Any:
    middleware: list[Any] = [
        ModelRouterMiddleware(
            router,
            "support",
            models={"billing": models["billing"], "technical": models["technical"]},
            frontier=models["frontier"],
        )
    ]
    if gate:
        middleware.append(PolicyGateMiddleware(router, "tools"))
    return create_agent(models["frontier"], tools=[lookup], middleware=middleware, checkpointer=checkpointer)


def _looks_up(call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[call("lookup", call_id, query=call_id)])


def _routings(engine: Any) -> int:
    return sum("support" in questions for _, questions in engine.calls)


async def test_each_user_turn_gets_its_model_and_keeps_it_for_the_whole_tool_loop() -> None:
    router, engine, sink = counted_router()
    log = Answered()
    models = _models(
        log,
        frontier=[_looks_up("f1"), AIMessage("hello, how can I help?")],
        billing=[_looks_up("b1"), _looks_up("b2"), AIMessage("refund on its way")],
    )
    agent = _agent(router, models, InMemorySaver())
    config = {"configurable": {"thread_id": "two-turns"}}

    first = await agent.ainvoke({"messages": [HumanMessage("hello there")]}, config)
    assert first[ROUTE_KEY]["model"] == "frontier" and first[ROUTE_KEY]["route"] is None
    assert (
        first[ROUTE_KEY]["decision"]["escalate"] is True
        and first[ROUTE_KEY]["reason"] == first[ROUTE_KEY]["decision"]["reason"]
    )
    second = await agent.ainvoke({"messages": [HumanMessage("I was charged twice, I want a refund")]}, config)

    # Three model calls in turn two's tool loop, all by the billing model; one routing decision per turn.
    assert log.models == ["frontier", "frontier", "billing", "billing", "billing"]
    assert looked_up == ["f1", "b1", "b2"]
    assert _routings(engine) == 2 and [d.task for d in sink.decisions] == ["support", "support"]
    record = second[ROUTE_KEY]
    humans = [m for m in second["messages"] if isinstance(m, HumanMessage)]
    assert record["turn"] == humans[-1].id and record["model"] == "billing" and record["route"] == "billing"
    assert record["decision"]["system"] == 1 and record["decision"]["policy_version"] == "sha256:test"
    assert second["messages"][-1].content == "refund on its way"


async def test_a_user_turn_system_1_cannot_read_goes_to_the_frontier_model_without_a_decision() -> None:
    # An image alone: no text to route. The turn is the frontier model's, and the agent goes on.
    router, engine, sink = counted_router()
    log = Answered()
    agent = _agent(router, _models(log, frontier=[AIMessage("a nice picture")]), InMemorySaver())
    image = {"type": "image", "url": "https://example.com/cat.png"}
    state = await agent.ainvoke({"messages": [HumanMessage(content=[image])]}, {"configurable": {"thread_id": "img"}})
    record = state[ROUTE_KEY]
    assert record["model"] == "frontier" and record["route"] is None and record["reason"] == "unreadable"
    assert "no text" in record["detail"]
    assert log.models == ["frontier"] and _routings(engine) == 0 and sink.decisions == []


def test_under_invoke_a_paused_tool_loop_resumes_on_the_same_model(tmp_path: Path) -> None:
    router, engine, _ = counted_router()
    log = Answered()
    truncate = AIMessage("", tool_calls=[call("lookup", "t1", query="truncate log")])
    models = _models(
        log,
        billing=[AIMessage("refunded")],
        technical=[_looks_up("x1"), truncate, AIMessage("fixed")],
    )
    with SqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
        agent = _agent(router, models, saver, gate=True)
        config = {"configurable": {"thread_id": "sync"}}
        agent.invoke({"messages": [HumanMessage("refund please")]}, config)
        paused = agent.invoke({"messages": [HumanMessage("the app crashes on start")]}, config)
        assert paused["__interrupt__"][0].value["action_requests"][0]["args"] == {"query": "truncate log"}
        out = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert log.models == ["billing", "technical", "technical", "technical"]
    assert _routings(engine) == 2  # the resume did not route the turn again
    assert out[ROUTE_KEY]["model"] == "technical" and out["messages"][-1].content == "fixed"
    assert looked_up == ["x1", "truncate log"]


def test_thinking_is_switched_off_for_model_calls_that_offer_tools() -> None:
    router, _, _ = counted_router()
    log = Answered()
    models = _models(log, frontier=[_looks_up("f1"), AIMessage("done")])
    models["frontier"].thinking = {"type": "enabled", "budget_tokens": 2048}
    _agent(router, models, None).invoke({"messages": [HumanMessage("hello there")]})
    assert [(c["model"], c["thinking"], c["tools"]) for c in log.calls] == [("frontier", None, ["lookup"])] * 2
    # Without tools there is no tool loop to keep signed thinking blocks for: thinking stays on.
    bare = create_agent(
        models["frontier"],
        middleware=[
            ModelRouterMiddleware(
                router,
                "support",
                models={"billing": models["billing"], "technical": models["technical"]},
                frontier=models["frontier"],
            )
        ],
    )
    bare.invoke({"messages": [HumanMessage("hello there")]})
    assert log.calls[-1]["thinking"] == {"type": "enabled", "budget_tokens": 2048}


def _thinking_reply(text: str, form: str, **kwargs: Any) -> AIMessage:
    return AIMessage(
        content=[
            {"type": "thinking", "thinking": f"I should consider {CANARY}", "signature": CANARY},
            {"type": "redacted_thinking", "data": CANARY},
            {"type": "reasoning", "reasoning": CANARY},
            {"type": "text", "text": INLINE_FORMS[form](text)},
        ],
        additional_kwargs={"reasoning_content": CANARY, "reasoning": {"summary": [CANARY]}},
        response_metadata={"reasoning": CANARY},
        **kwargs,
    )


def test_without_thoughts_cuts_every_form_and_keeps_the_answer() -> None:
    for form in INLINE_FORMS:
        cleaned = without_thoughts(AIMessage(INLINE_FORMS[form]("the answer")))
        assert cleaned.content == "the answer", form
        blocks = without_thoughts(_thinking_reply("the answer", form))
        assert CANARY not in repr(blocks) and blocks.content == [{"type": "text", "text": "the answer"}], form


CANARY_POLICY = """\
version: 1
defaults:
  thresholds: {min_confidence: 0.9}
tasks:
  support:
    kind: route
    routes:
      billing: Charges, invoices and refunds.
      technical: Errors and crashes.
    none_of_these: other
  tools:
    kind: check
    on_failure: escalate
    rules:
      destructive:
        instructions: Would this tool call delete or overwrite data?
        deny_at: 0.8
        allow_at: 0.3
      exfiltration:
        instructions: Would this tool call send data out?
        deny_at: 0.8
        allow_at: 0.3
"""


def _unsure(state: Any, name: str, question: Any) -> Any:
    """System 1 settles nothing about the turns (escalated) nor about the order look-ups (no answer)."""
    if name.startswith("tools.") and "truncate" not in str(state):
        return None
    return keyword_script(state, name, question)


@asynccontextmanager
async def _thinking_world() -> AsyncIterator[tuple[Router, ThinkingChat, ScriptedServer]]:
    """A router whose System 2 is fastslow's own ``Frontier`` (the OpenAI SDK) to a server thinking the canary."""
    chat = ThinkingChat()
    with openai_server(respond=chat) as (url, server):
        frontier = Frontier(System2Settings(openai_base_url=url, openai_api_key=SecretStr("sk-canary"), max_retries=0))
        policy = parse_policy(CANARY_POLICY)
        try:
            yield Router(lambda: policy, OneEngine(ScriptedEngine(_unsure)), frontier), chat, server
        finally:
            await frontier.aclose()


TEXTS = ("hello there", "and hello again")


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_thought_canary_reaches_no_agent_state_and_no_checkpoint(mode: str, tmp_path: Path) -> None:
    # Thoughts from both sides: the agent's own models (blocks, fields and inline markup in every form),
    # and fastslow's System 2 (reasoning fields and markup), which settles the routes and two checks.
    log = Answered()
    forms = list(INLINE_FORMS)
    script = [
        _thinking_reply("Let me look.", forms[0], tool_calls=[call("lookup", "c1", query="order 7")]),
        _thinking_reply("Here is what I found.", forms[1]),
        _thinking_reply("Let me tidy up.", forms[2], tool_calls=[call("lookup", "c2", query="truncate log")]),
        _thinking_reply("Tidied.", forms[3]),
    ]
    assert all(CANARY in repr(m) for m in script)  # the canary really is served
    # Turn one goes to the frontier (System 2 routed it); turn two sticks to its route, billing.
    models = _models(log, frontier=script[:2], billing=script[2:])
    db = str(tmp_path / "canary.sqlite")
    config = {"configurable": {"thread_id": "canary"}}
    approve = Command(resume={"decisions": [{"type": "approve"}]})
    async with _thinking_world() as (router, chat, server):
        if mode == "sync":
            with SqliteSaver.from_conn_string(db) as saver:
                agent = _agent(router, models, saver, gate=True)
                turns: list[Any] = [{"messages": [HumanMessage(t)]} for t in TEXTS]
                outs = [await asyncio.to_thread(agent.invoke, t, config) for t in [*turns, approve]]
                history = list(agent.get_state_history(config))
                stored = list(saver.list(config))
        else:
            async with AsyncSqliteSaver.from_conn_string(db) as asaver:
                agent = _agent(router, models, asaver, gate=True)
                outs = [await agent.ainvoke({"messages": [HumanMessage(t)]}, config) for t in TEXTS]
                outs.append(await agent.ainvoke(approve, config))
                history = [snapshot async for snapshot in agent.aget_state_history(config)]
                stored = [saved async for saved in asaver.alist(config)]

    first, paused, out = outs
    # System 2 did think, and did decide: both routes, and the first turn's look-up.
    assert {"reasoning", "reasoning_content"} <= set(chat.served) and len(set(chat.served) & set(forms)) >= 3
    assert first[ROUTE_KEY]["decision"]["system"] == 2 and first[ROUTE_KEY]["model"] == "frontier"
    assert first[GATE_KEY][0]["by"] == "System 2" and first[GATE_KEY][0]["verdict"] == "allow"
    assert paused[ROUTE_KEY]["model"] == "billing" and "__interrupt__" in paused
    assert out[GATE_KEY][0]["by"] == "a person" and log.models == ["frontier", "frontier", "billing", "billing"]
    assert out["messages"][-1].text == "Tidied." and looked_up == ["order 7", "truncate log"]
    # And none of it was kept: final states, the pause, every state and checkpoint, the database's bytes.
    assert all(CANARY not in repr(o) for o in outs)
    assert len(history) > 6 and all(CANARY not in repr((s.values, s.tasks, s.interrupts)) for s in history)
    for saved in stored:
        assert CANARY not in repr(saved.checkpoint) and CANARY not in repr(saved.pending_writes)
    for path in tmp_path.iterdir():  # the database, and its journal files, as raw bytes
        assert CANARY.encode() not in path.read_bytes(), path.name
    # Nor did any thought go back to a model: the agent's, or System 2, which read the conversation.
    assert all(CANARY not in repr(c["messages"]) for c in log.calls)
    assert server.requests and CANARY not in json.dumps(server.requests)


# --- configuration errors, when the middleware is built -----------------------------------------


def _router_middleware(router: Router, task: str, models: dict[str, Any]) -> ModelRouterMiddleware:
    return ModelRouterMiddleware(router, task, models=models, frontier=ScriptedChatModel(label="frontier"))


@pytest.mark.parametrize(
    ("build", "key"),
    [
        (lambda r: PolicyGateMiddleware(r, "tool_safety"), "tasks.tool_safety"),
        (lambda r: PolicyGateMiddleware(r, "support"), "tasks.support.kind"),
        (lambda r: _router_middleware(r, "nope", {}), "tasks.nope"),
        (lambda r: _router_middleware(r, "tools", {}), "tasks.tools.kind"),
        (
            lambda r: _router_middleware(r, "support", {"billing": ScriptedChatModel(label="b")}),
            "tasks.support.routes.technical",
        ),
        (
            lambda r: _router_middleware(
                r, "support", {n: ScriptedChatModel(label=n) for n in ("billing", "technical", "refunds")}
            ),
            "models.refunds",
        ),
        (lambda r: PolicyGateMiddleware(r, "tools", allowed_decisions=["approve", "respond"]), "allowed_decisions"),
    ],
)
def test_bad_configuration_fails_when_the_middleware_is_built(build: Any, key: str) -> None:
    router, engine, _ = counted_router()
    with pytest.raises(ConfigError) as caught:
        build(router)
    assert caught.value.key == key and repr(key) in str(caught.value)
    assert engine.calls == []


def test_a_none_of_these_route_needs_no_model() -> None:
    router, _, _ = counted_router()
    two = {n: ScriptedChatModel(label=n) for n in ("billing", "technical")}
    assert _router_middleware(router, "support", two).models == two  # "other" goes to the frontier


# --- the package ----------------------------------------------------------------------------------


def test_the_graphs_package_never_loads_langchain_and_the_middleware_names_its_surface() -> None:
    import fastslow.graphs.middleware as middleware

    # (test_exports.py checks the other packages' surfaces; ruff's RUF022 keeps this one sorted.)
    assert middleware.__doc__ and all(getattr(middleware, name) is not None for name in middleware.__all__)
    probe = (
        "import sys, fastslow.graphs\n"
        "assert not [m for m in sys.modules if m == 'langchain' or m.startswith('langchain.')], 'langchain loaded'\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- the example ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_example_agent_runs_offline() -> None:
    # The FASTSLOW_ settings left are the test's own (tmp data dir, the session's embedding cache),
    # so the example writes nothing under the user's data directory.
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_BASE_URL"))}
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "create_agent.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=REPO / "examples",
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.split("user: ")[1:]
    # An open-ended request goes to the frontier model, whose destructive call is refused ...
    assert "model: frontier (route None, open_ended)" in first and "tool call shell: deny by System 1" in first
    assert "answer: [frontier] error: Refused by policy 'tool_safety'" in first
    # ... a billing question to the small model, whose read runs (allowed, or approved on review).
    assert "model: billing (route billing" in second and "tool call read_file: allow" in second
    assert "answer: [small] success:" in second
