"""The lean node and edge forms: what LangGraph runs, the decision record, and ``route_edge`` in real graphs."""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType, SimpleNamespace
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableLambda
from langgraph.graph import END, START, StateGraph, add_messages

from fastslow.router import (
    Answer,
    ConfigError,
    Decision,
    EngineFailure,
    NoAnswer,
    Question,
    Router,
    State,
    Thresholds,
    classify_node,
    decide_answer,
    policy_gate_node,
    route_edge,
    router_node,
)
from fastslow.router._nodes import decision_record
from fastslow.router.engine_api import Signals

from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedEngine


def _last(_: Any, new: Any) -> Any:
    return new


class S(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    route: Annotated[str | None, _last]
    decision: Annotated[dict[str, Any], _last]
    handled: Annotated[list[str], operator.add]


def _script(state: State, name: str, question: Question) -> Any:
    del question
    text = str(state).lower()
    if name == "support":
        if "refund" in text:
            return {"billing": 0.9, "technical": 0.05, "other": 0.05}
        if "crash" in text:
            return {"billing": 0.05, "technical": 0.9, "other": 0.05}
        return {"billing": 0.34, "technical": 0.33, "other": 0.33}
    return {"yes": 0.02, "no": 0.98}


@dataclass
class ListSink:
    """A decision log that keeps what it is given, in order."""

    decisions: list[Decision] = field(default_factory=list)

    async def record(self, decision: Decision, *, state: State) -> None:
        del state
        self.decisions.append(decision)


def _router(sink: ListSink | None = None, **task: Any) -> Router:
    policy = three_task_policy(**task)
    return Router(lambda: policy, OneEngine(ScriptedEngine(_script)), Chats(None), sink=sink)


def _agent(name: str) -> Any:
    def node(state: S) -> dict[str, Any]:
        return {"messages": [AIMessage(f"{name} here")], "handled": [name]}

    return node


def _edge_graph(edge: Runnable[Any, Any], *, writes_route: bool = False) -> StateGraph[S, Any, S, S]:
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    for name in ("billing", "technical", "frontier"):
        agent = _agent(name)
        if writes_route:
            # What a graph does to keep stickiness with the edge form and send=True: the agent
            # that takes the conversation writes the route and the decision it was given.
            def agent(state: S, name: str = name) -> dict[str, Any]:
                return {"handled": [name], "route": state.get("route"), "decision": state.get("decision")}

        graph.add_node(name, agent)
        graph.add_edge(name, END)
    graph.add_conditional_edges(START, edge, ["billing", "technical", "frontier"])
    return graph


# --- what LangGraph runs ---------------------------------------------------------------------


def test_every_factory_gives_a_runnable_langgraph_runs_as_it_is() -> None:
    router = _router()
    made = [
        router_node(router, "support"),
        policy_gate_node(router, "tools"),
        classify_node(router, "triage"),
        route_edge(router, "support"),
    ]
    for runnable in made:
        assert isinstance(runnable, Runnable) and not isinstance(runnable, RunnableLambda)
    node = made[0]
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("route", node, destinations=("billing",))
    # Not wrapped: LangGraph calls the node's own invoke / ainvoke.
    assert graph.nodes["route"].runnable is node
    assert node.name == "router:support" and made[3].name == "route:support"


# --- the decision record ---------------------------------------------------------------------


def _full_decision() -> Decision:
    return Decision(
        task="support",
        question="support",
        outcome="billing",
        system=2,
        reason="sticky",
        escalate=True,
        confidence=0.61,
        threshold=0.7,
        probabilities={"billing": 0.61, "technical": 0.39},
        verdict="review",
        policy_version="sha256:v",
        engine="jev:jev",
        model="jev-1",
        latency_ms=3.5,
        detail="kept previous route",
        cost_usd=0.002,
        audit=True,
        audit_rate=0.1,
        examples_version="4-abc",
    )


@pytest.mark.parametrize(
    "decision", [_full_decision(), Decision(task="t", question="q", outcome=None, system=1, reason="no_answer")]
)
def test_the_decision_record_equals_the_asdict_record_field_for_field(decision: Decision) -> None:
    expected = asdict(decision)
    expected["probabilities"] = dict(decision.probabilities)
    record = decision_record(decision)
    assert record == expected
    assert list(record) == [f.name for f in fields(Decision)]
    assert type(record["probabilities"]) is dict and record["probabilities"] is not decision.probabilities


def test_the_decision_record_copies_any_mapping_of_probabilities_to_a_plain_dict() -> None:
    # asdict could not deep-copy a read-only mapping at all; the record takes any Mapping.
    decision = Decision(
        task="t", question="q", outcome="a", system=1, reason="confident", probabilities=MappingProxyType({"a": 1.0})
    )
    assert decision_record(decision)["probabilities"] == {"a": 1.0}
    assert type(decision_record(decision)["probabilities"]) is dict


# --- decide_answer, built once ---------------------------------------------------------------

ANSWER = Answer(
    question="support",
    kind="choice",
    probabilities={"billing": 0.6, "technical": 0.35, "other": 0.05},
    engine="e",
    model="m",
    latency_ms=2.0,
    signals=Signals(label_mass=0.4),
)


@pytest.mark.parametrize(
    ("thresholds", "none_option", "expected"),
    [
        (Thresholds(min_confidence=0.5), None, ("confident", "billing", False, 0.5, "")),
        (Thresholds(min_confidence=0.9), None, ("low_confidence", None, True, 0.9, "")),
        (Thresholds(min_confidence=0.5, min_margin=0.3), None, ("small_margin", None, True, 0.3, "")),
        (Thresholds(min_confidence=0.5, min_label_mass=0.5), None, ("weak_signal", None, True, 0.0, "label_mass")),
        (Thresholds(min_confidence=0.5, min_label_mass=0.5), "billing", ("none_of_these", None, True, 0.5, "")),
    ],
)
def test_decide_answer_keeps_every_field_of_each_outcome(
    thresholds: Thresholds, none_option: str | None, expected: tuple[str, str | None, bool, float, str]
) -> None:
    decision = decide_answer("support", ANSWER, thresholds=thresholds, none_option=none_option, policy_version="v1")
    reason, outcome, escalate, threshold, detail = expected
    assert (decision.reason, decision.outcome, decision.escalate, decision.threshold) == (
        reason,
        outcome,
        escalate,
        threshold,
    )
    assert decision.detail.startswith(detail) and (detail or not decision.detail)
    assert (decision.task, decision.question, decision.system, decision.policy_version) == (
        "support",
        "support",
        1,
        "v1",
    )
    assert (decision.engine, decision.model, decision.latency_ms, decision.confidence) == ("e", "m", 2.0, 0.6)
    assert dict(decision.probabilities) == ANSWER.probabilities and decision.verdict is None


def test_decide_answer_on_no_answer_and_failure_keeps_who_answered() -> None:
    no = NoAnswer(question="support", kind="choice", reason="null", engine="e", model="m", latency_ms=1.5)
    decision = decide_answer("support", no, thresholds=Thresholds(), policy_version="v1")
    assert (decision.reason, decision.escalate, decision.detail) == ("no_answer", True, "null")
    assert (decision.engine, decision.model, decision.latency_ms, decision.policy_version) == ("e", "m", 1.5, "v1")
    failed = decide_answer("support", EngineFailure(message="slow", timeout=True), thresholds=Thresholds())
    assert (failed.reason, failed.question, failed.escalate, failed.engine) == ("timeout", "support", True, "")


# --- the node and the edge keep the router's behaviour ---------------------------------------


async def test_the_node_records_each_decision_in_the_sink_and_in_state() -> None:
    sink = ListSink()
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("route", router_node(_router(sink), "support"), destinations=("billing", "technical", "frontier"))
    for name in ("billing", "technical", "frontier"):
        graph.add_node(name, _agent(name))
        graph.add_edge(name, END)
    graph.add_edge(START, "route")
    out = await graph.compile().ainvoke({"messages": [HumanMessage("the app crashes")]})
    assert out["handled"] == ["technical"] and [d.outcome for d in sink.decisions] == ["technical"]
    assert out["decision"] == decision_record(sink.decisions[0])


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_route_edge_routes_escalates_and_logs_in_a_real_graph(mode: str) -> None:
    sink = ListSink()
    app = _edge_graph(route_edge(_router(sink), "support")).compile()

    async def run(state: dict[str, Any]) -> dict[str, Any]:
        return app.invoke(state) if mode == "invoke" else await app.ainvoke(state)

    assert (await run({"messages": [HumanMessage("I want a refund")]}))["handled"] == ["billing"]
    unsure = await run({"messages": [HumanMessage("hello there")]})
    assert unsure["handled"] == ["frontier"] and "route" not in unsure  # an edge writes no state
    assert [(d.outcome, d.escalate) for d in sink.decisions] == [("billing", False), (None, True)]
    assert "no frontier model configured" in sink.decisions[1].detail


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_route_edge_keeps_the_previous_route_read_from_state(mode: str) -> None:
    sink = ListSink()
    app = _edge_graph(route_edge(_router(sink), "support")).compile()
    state = {"messages": [HumanMessage("ok do it")], "route": "billing"}
    out = app.invoke(state) if mode == "invoke" else await app.ainvoke(state)
    assert out["handled"] == ["billing"]
    assert (sink.decisions[0].reason, sink.decisions[0].outcome) == ("sticky", "billing")


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_route_edge_with_send_hands_the_decision_to_the_node_it_picks(mode: str) -> None:
    sink = ListSink()
    app = _edge_graph(route_edge(_router(sink), "support", send=True), writes_route=True).compile()
    state = {"messages": [HumanMessage("refund me")]}
    out = app.invoke(state) if mode == "invoke" else await app.ainvoke(state)
    assert out["handled"] == ["billing"] and out["route"] == "billing"
    assert out["decision"] == decision_record(sink.decisions[0])
    # The route is now in state, so a follow-up the engine is unsure of sticks to it.
    follow = {"messages": [HumanMessage("and then?")], "route": out["route"]}
    again = app.invoke(follow) if mode == "invoke" else await app.ainvoke(follow)
    assert again["handled"] == ["billing"] and again["decision"]["reason"] == "sticky"


async def test_route_edge_maps_routes_to_nodes_and_follows_a_shadow_incumbent() -> None:
    async def incumbent(state: Any, name: str) -> str | None:
        del name
        return "technical" if "crash" in state["messages"][-1].content else "billing"

    sink = ListSink()
    edge = route_edge(_router(sink, mode="shadow"), "support", incumbent=incumbent, routes={"technical": "frontier"})
    app = _edge_graph(edge).compile()
    # System 1 says billing; the incumbent decides, and its route maps to the frontier node.
    out = await app.ainvoke({"messages": [HumanMessage("refund: the app crashes")]})
    assert out["handled"] == ["frontier"]
    assert (sink.decisions[0].reason, sink.decisions[0].outcome) == ("shadow", "technical")


async def test_route_edge_with_send_needs_a_mapping_state() -> None:
    edge = route_edge(_router(), "support", send=True)
    with pytest.raises(ConfigError, match="mapping graph state"):
        await edge.ainvoke(SimpleNamespace(messages=[HumanMessage("refund")], route=None))
    assert (
        await route_edge(_router(), "support").ainvoke(SimpleNamespace(messages=[HumanMessage("refund")])) == "billing"
    )
