"""LangSmith: in a traced graph run, each fastslow node's run carries its decision, and its calls are child runs.

A loopback stand-in for LangSmith's API (``fakes.langsmith``) receives what the ``langsmith``
client sends once ``LANGSMITH_TRACING``, ``LANGSMITH_ENDPOINT`` and ``LANGSMITH_API_KEY`` point it
there: the runs as LangSmith would store them, decoded from the client's own (zstd-compressed)
multipart batches. System 1 is a scripted engine behind the ``TracedEngine`` wrapper the engine
pool puts on every engine; System 2 is the real ``Frontier`` over the OpenAI SDK to a loopback
server that thinks out loud, so the thought's absence is shown too.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator
from datetime import datetime
from typing import Annotated, Any, TypedDict

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph, add_messages
from pydantic import SecretStr

import fastslow.router._nodes as nodes
from fastslow.engines.chat import Frontier
from fastslow.graphs.middleware import ModelRouterMiddleware, PolicyGateMiddleware
from fastslow.router import EngineUnavailable, Router, classify_node, policy_gate_node, route_edge, router_node
from fastslow.router.engine_api import TracedEngine
from fastslow.router.settings import ModelPrice, System2Settings

from fakes.chat_models import Answered, ScriptedChatModel, call, keyword_script
from fakes.langsmith import LangSmithStandIn, flush_tracing, langsmith_standin, langsmith_tracing
from fakes.openai_server import openai_server, structured
from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedEngine

pytestmark = pytest.mark.integration

THOUGHT = "CANARY-LANGSMITH-THOUGHT-91c2: they sound unsure"
UNSURE = "something is off with my thing"  # System 1 splits it three ways: escalated


def _last(_: Any, new: Any) -> Any:
    return new


class S(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    route: Annotated[str | None, _last]
    decision: Annotated[dict[str, Any] | None, _last]
    handled: Annotated[list[str], operator.add]
    gate: list[dict[str, Any]]
    classification: dict[str, Any]
    classification_decisions: dict[str, Any]


def _router(chats: Any = None, *, engine: Any = None, trace_state_text: bool = False) -> Router:
    policy = three_task_policy()
    system1 = TracedEngine(engine or ScriptedEngine(keyword_script))
    return Router(lambda: policy, OneEngine(system1), chats or Chats(None), trace_state_text=trace_state_text)


def _support(router: Router) -> Any:
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("route", router_node(router, "support"), destinations=("billing", "technical", "frontier"))
    for name in ("billing", "technical", "frontier"):
        graph.add_node(name, lambda _state, name=name: {"handled": [name]})
        graph.add_edge(name, END)
    graph.add_edge(START, "route")
    return graph.compile()


def _metadata(run: dict[str, Any]) -> dict[str, Any]:
    metadata: dict[str, Any] = (run.get("extra") or {}).get("metadata") or {}
    return metadata


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _assert_child(standin: LangSmithStandIn, parent: dict[str, Any], child: dict[str, Any]) -> None:
    """``child`` sits under ``parent`` in LangSmith's tree, within its time."""
    assert str(child["parent_run_id"]) == str(parent["id"]) and child["trace_id"] == parent["trace_id"]
    assert child["dotted_order"].startswith(parent["dotted_order"] + ".")
    assert _time(parent["start_time"]) <= _time(child["start_time"]) <= _time(child["end_time"])
    assert _time(child["end_time"]) <= _time(parent["end_time"])
    assert child in standin.children(parent)


@pytest.fixture
def standin() -> Iterator[LangSmithStandIn]:
    with langsmith_standin() as server:
        yield server


def test_a_route_nodes_run_carries_its_decision_and_its_engine_call_is_a_child_run(standin: LangSmithStandIn) -> None:
    with langsmith_tracing(standin):
        out = _support(_router()).invoke({"messages": [HumanMessage("I want a refund")]})
        flush_tracing()

    decision = out["decision"]
    run = standin.run_named("route")
    metadata = _metadata(run)
    assert metadata["fastslow.decision.id"] == decision["id"]
    assert metadata["fastslow.decision.system"] == 1 and metadata["fastslow.decision.reason"] == "confident"
    assert metadata["fastslow.decision.confidence"] == pytest.approx(decision["confidence"])
    assert metadata["fastslow.decision.outcome"] == "billing" and metadata["fastslow.task"] == "support"
    assert metadata["fastslow.policy.version"] == "sha256:test" and metadata["langgraph_node"] == "route"
    assert {
        "fastslow",
        "fastslow:route",
        "fastslow:system1",
        "fastslow:reason:confident",
        "fastslow:route:billing",
    } <= set(run["tags"])

    [child] = standin.children(run)
    _assert_child(standin, run, child)
    assert (child["name"], child["run_type"]) == ("system1 scripted", "llm")
    assert _metadata(child)["fastslow.engine"] == "scripted" and _metadata(child)["ls_model_name"] == "scripted-1"
    assert "fastslow.decision.id" not in _metadata(child)  # a call is not the decision
    assert "refund" not in json.dumps(child)  # no state text unless the router opts in
    assert not child.get("error")


async def test_an_escalated_route_has_a_system2_child_run_with_usage_and_cost_and_no_thought(
    standin: LangSmithStandIn,
) -> None:
    reply = structured({"answer": "technical"}, reasoning=THOUGHT)
    with openai_server(respond=lambda _body: reply) as (url, server):
        settings = System2Settings(
            openai_base_url=url,
            openai_api_key=SecretStr("sk-test"),
            max_retries=0,
            prices={"openai:gpt-5.5": ModelPrice(input=1.0, output=4.0)},
        )
        frontier = Frontier(settings)
        with langsmith_tracing(standin):
            out = await _support(_router(frontier)).ainvoke({"messages": [HumanMessage(UNSURE)]})
            flush_tracing()
        await frontier.aclose()
    assert server.requests and out["handled"] == ["technical"]

    run = standin.run_named("route")
    metadata = _metadata(run)
    assert metadata["fastslow.decision.id"] == out["decision"]["id"] and metadata["fastslow.decision.system"] == 2
    assert metadata["fastslow.decision.reason"] == out["decision"]["reason"] != "confident"
    assert (
        metadata["fastslow.cost_usd"] == pytest.approx(out["decision"]["cost_usd"])
        and metadata["fastslow.cost_usd"] > 0
    )
    assert {"fastslow:system2", "fastslow:route:technical"} <= set(run["tags"])

    system1, system2 = standin.children(run)
    for child in (system1, system2):
        _assert_child(standin, run, child)
    assert system1["name"] == "system1 scripted" and system2["name"] == "system2 gpt-5.5"
    assert _time(system1["end_time"]) <= _time(system2["start_time"])  # System 2 only after System 1
    usage = _metadata(system2)["usage_metadata"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (11, 7, 18)
    assert usage["total_cost"] == pytest.approx(out["decision"]["cost_usd"])
    assert (
        _metadata(system2)["ls_provider"] == "openai" and _metadata(system2)["gen_ai.response.model"] == "served-model"
    )
    assert THOUGHT.encode() not in standin.received_bytes()
    assert UNSURE not in json.dumps([system1, system2])


def test_a_failed_engine_call_is_a_child_run_with_its_error_type(standin: LangSmithStandIn) -> None:
    def down(*_: Any) -> Any:
        return EngineUnavailable("scripted outage, quoting the request: I want a refund")

    with langsmith_tracing(standin):
        out = _support(_router(engine=ScriptedEngine(down))).invoke({"messages": [HumanMessage("I want a refund")]})
        flush_tracing()
    run = standin.run_named("route")
    assert _metadata(run)["fastslow.decision.reason"] == out["decision"]["reason"] == "engine_error"
    [child] = standin.children(run)
    assert child["error"] == "EngineUnavailable"  # the type, never the text (it may quote the request)
    assert "refund" not in json.dumps(child)


def test_a_route_edges_decision_goes_onto_the_run_of_the_node_it_leaves(standin: LangSmithStandIn) -> None:
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("intake", lambda _state: {"handled": ["intake"]})
    for name in ("billing", "technical", "frontier"):
        graph.add_node(name, lambda _state, name=name: {"handled": [name]})
        graph.add_edge(name, END)
    graph.add_edge(START, "intake")
    graph.add_conditional_edges("intake", route_edge(_router(), "support"), ["billing", "technical", "frontier"])
    with langsmith_tracing(standin):
        out = graph.compile().invoke({"messages": [HumanMessage("I want a refund")]})
        flush_tracing()
    assert out["handled"] == ["intake", "billing"]
    intake = standin.run_named("intake")
    assert _metadata(intake)["fastslow.decision.outcome"] == "billing" and "fastslow:route:billing" in intake["tags"]
    assert [c["name"] for c in standin.children(intake)] == ["system1 scripted"]


def _proposes(state: S) -> dict[str, Any]:
    del state
    calls = [call("delete_file", "c-rm", path="rm -rf /data"), call("read_file", "c-read", path="a.txt")]
    return {"messages": [AIMessage("", tool_calls=calls)]}


def test_a_gate_run_carries_each_calls_verdict_and_rule_decision_ids_and_a_classify_run_its_answers(
    standin: LangSmithStandIn,
) -> None:
    router = _router()
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("triage", classify_node(router, "triage"))
    graph.add_node("propose", _proposes)
    graph.add_node("gate", policy_gate_node(router, "tools"), destinations=("tools", "agent"))
    graph.add_node("tools", lambda _state: {"handled": ["tools"]})
    graph.add_node("agent", lambda _state: {"handled": ["agent"]})
    graph.add_edge(START, "triage")
    graph.add_edge("triage", "propose")
    graph.add_edge("propose", "gate")
    with langsmith_tracing(standin):
        out = graph.compile().invoke({"messages": [HumanMessage("tidy up my files")]})
        flush_tracing()
    assert [g["verdict"] for g in out["gate"]] == ["deny", "allow"]

    gate = standin.run_named("gate")
    checks = {entry["tool_call_id"]: entry for entry in _metadata(gate)["fastslow.checks"]}
    assert (
        checks["c-rm"]["fastslow.decision.verdict"] == "deny" and checks["c-rm"]["fastslow.check.rule"] == "destructive"
    )
    assert checks["c-read"]["fastslow.decision.verdict"] == "allow" and checks["c-rm"]["tool"] == "delete_file"
    for entry in checks.values():
        ids = entry["fastslow.check.decision_ids"]
        assert set(ids) == {"destructive", "exfiltration"} and len(set(ids.values())) == 2
        assert entry["fastslow.decision.id"] == ids[entry["fastslow.check.rule"]]
        assert entry["fastslow.decision.system"] == 1 and entry["fastslow.decision.reason"] == "confident"
    assert {"fastslow:check", "fastslow:verdict:deny", "fastslow:verdict:allow"} <= set(gate["tags"])
    assert "rm -rf" not in json.dumps(_metadata(gate))  # tool names, never arguments

    # Each check is a LangGraph task with a run of its own under the gate's: its calls hang there.
    tasks = [run for run in standin.children(gate) if run["name"] == "policy_check"]
    assert len(tasks) == 2
    for task in tasks:
        [engine_call] = standin.children(task)
        _assert_child(standin, task, engine_call)
        assert engine_call["name"] == "system1 scripted"
        assert _metadata(task)["fastslow.decision.id"] in {c["fastslow.decision.id"] for c in checks.values()}

    triage = standin.run_named("triage")
    decided = _metadata(triage)["fastslow.decisions"]
    assert set(decided) == {"urgent", "tone"}
    for question, record in out["classification_decisions"].items():
        assert decided[question]["fastslow.decision.id"] == record["id"]
        assert decided[question]["fastslow.decision.reason"] == record["reason"]
    assert "fastslow:classify" in triage["tags"] and standin.children(triage)


@tool
def lookup(query: str) -> str:
    """Look something up in the order system."""
    return f"found {query}"


def test_the_create_agent_hooks_runs_carry_the_route_and_the_gates_verdict(standin: LangSmithStandIn) -> None:
    router = _router()
    log = Answered()
    billing = ScriptedChatModel(
        label="billing", script=[AIMessage("", tool_calls=[call("lookup", "c1", query="q")]), AIMessage("ok")], log=log
    )
    frontier, technical = (ScriptedChatModel(label=name, log=log) for name in ("frontier", "technical"))
    middleware = [
        ModelRouterMiddleware(
            router, "support", models={"billing": billing, "technical": technical}, frontier=frontier
        ),
        PolicyGateMiddleware(router, "tools"),
    ]
    agent = create_agent(frontier, tools=[lookup], middleware=middleware, checkpointer=InMemorySaver())
    with langsmith_tracing(standin):
        out = agent.invoke({"messages": [HumanMessage("I want a refund")]}, {"configurable": {"thread_id": "t"}})
        flush_tracing()
    assert log.models == ["billing", "billing"]

    routed = standin.run_named("ModelRouter[support].before_agent")
    assert _metadata(routed)["fastslow.decision.id"] == out["fastslow_route"]["decision"]["id"]
    assert _metadata(routed)["fastslow.model"] == "billing" and "fastslow:route:billing" in routed["tags"]
    [child] = standin.children(routed)
    _assert_child(standin, routed, child)

    gates = [r for r in standin.runs().values() if r.get("name") == "PolicyGate[tools].after_model"]
    [checked] = [r for r in gates if "fastslow.checks" in _metadata(r)]  # the model turn that proposed a call
    assert _metadata(checked)["fastslow.decision.verdict"] == "allow"
    [task] = standin.children(checked)
    assert [c["name"] for c in standin.children(task)] == ["system1 scripted"]


def test_state_text_reaches_child_runs_only_when_the_router_opts_in(standin: LangSmithStandIn) -> None:
    with langsmith_tracing(standin):
        _support(_router(trace_state_text=True)).invoke({"messages": [HumanMessage("I want a refund")]})
        flush_tracing()
    [child] = standin.children(standin.run_named("route"))
    assert child["inputs"]["state"] == "I want a refund"


def test_with_tracing_off_nothing_reaches_langsmith_and_no_call_is_observed(
    standin: LangSmithStandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    def observed(*_: Any, **__: Any) -> Any:
        raise AssertionError("a node observed its calls with tracing off")

    monkeypatch.setattr(nodes, "posting_calls", observed)
    router = _router()
    with langsmith_tracing(standin, enabled=False):  # the endpoint and key are set, tracing is not
        out = _support(router).invoke({"messages": [HumanMessage("I want a refund")]})
        flush_tracing()
    assert out["route"] == "billing"
    assert standin.requests == []
