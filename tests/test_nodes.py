"""The LangGraph nodes inside real graphs: routing, checkpoints, subgraphs, Send, the policy gate."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph, add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Send

from fastslow.router import (
    ConfigError,
    Decision,
    InvalidRequest,
    Question,
    Router,
    RouterState,
    State,
    classify_node,
    policy_gate_node,
    route_edge,
    router_node,
)

from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedEngine


def _last(_: Any, new: Any) -> Any:
    return new


class S(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    route: Annotated[str | None, _last]
    decision: Annotated[dict[str, Any], _last]
    handled: Annotated[list[str], operator.add]
    gate: list[dict[str, Any]]
    classification: dict[str, Any]
    classification_decisions: dict[str, Any]


def _keyword_script(state: State, name: str, question: Question) -> Any:
    # Like a model that reads only the current turn, so that stickiness is what keeps a follow-up.
    text = str(state["message"] if isinstance(state, dict) and "message" in state else state).lower()
    if name.endswith(".open_ended"):
        return {"yes": 0.9, "no": 0.1} if "poem" in text else {"yes": 0.05, "no": 0.95}
    if name == "support":
        if "charge" in text or "refund" in text:
            return {"billing": 0.9, "technical": 0.05, "other": 0.05}
        if "crash" in text:
            return {"billing": 0.05, "technical": 0.9, "other": 0.05}
        return {"billing": 0.34, "technical": 0.33, "other": 0.33}
    if name.startswith("tools."):
        rule = name.split(".")[1]
        if rule == "destructive":
            p = 0.97 if "rm" in text else 0.5 if "truncate" in text else 0.02
        else:
            p = 0.02
        return {"yes": p, "no": 1 - p}
    if name == "triage.urgent":
        return {"yes": 0.9, "no": 0.1} if "now" in text else {"yes": 0.1, "no": 0.9}
    return {"0": 0.8, "1": 0.1, "2": 0.1}


def _router() -> Router:
    policy = three_task_policy()
    return Router(lambda: policy, OneEngine(ScriptedEngine(_keyword_script)), Chats(None))


def _agent(name: str) -> Any:
    def node(state: S) -> dict[str, Any]:
        return {"messages": [AIMessage(f"{name} here")], "handled": [name]}

    return node


def _support_graph(router: Router) -> StateGraph[S, Any, S, S]:
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("route", router_node(router, "support"), destinations=("billing", "technical", "frontier"))
    for name in ("billing", "technical", "frontier"):
        graph.add_node(name, _agent(name))
        graph.add_edge(name, END)
    graph.add_edge(START, "route")
    return graph


def test_router_node_routes_synchronously_and_writes_the_decision() -> None:
    app = _support_graph(_router()).compile()
    out = app.invoke({"messages": [HumanMessage("I want a refund")]})
    assert out["handled"] == ["billing"]
    assert out["route"] == "billing"
    assert out["decision"]["system"] == 1 and out["decision"]["policy_version"] == "sha256:test"


async def test_router_node_routes_asynchronously_and_escalates_unsettled_decisions() -> None:
    app = _support_graph(_router()).compile()
    out = await app.ainvoke({"messages": [HumanMessage("hello there")]})
    assert out["handled"] == ["frontier"]
    assert out["route"] is None
    assert "no frontier model configured" in out["decision"]["detail"]


def test_checkpointed_conversations_keep_their_route_across_turns(tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.sqlite")) as saver:
        app = _support_graph(_router()).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t1"}}
        app.invoke({"messages": [HumanMessage("I was charged twice")]}, config)
        out = app.invoke({"messages": [HumanMessage("ok do it")]}, config)
        assert out["handled"] == ["billing", "billing"]
        assert out["decision"]["reason"] == "sticky"
    with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.sqlite")) as saver:
        app = _support_graph(_router()).compile(checkpointer=saver)
        assert app.get_state({"configurable": {"thread_id": "t1"}}).values["route"] == "billing"


async def test_async_sqlite_and_memory_checkpointers(tmp_path: Path) -> None:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
        app = _support_graph(_router()).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "t2"}}
        await app.ainvoke({"messages": [HumanMessage("the app crashes")]}, config)
        out = await app.ainvoke({"messages": [HumanMessage("and again")]}, config)
        assert out["handled"] == ["technical", "technical"]
    app = _support_graph(_router()).compile(checkpointer=InMemorySaver())
    out = await app.ainvoke({"messages": [HumanMessage("refund please")]}, {"configurable": {"thread_id": "m"}})
    assert out["route"] == "billing"


async def test_router_node_inside_a_subgraph() -> None:
    inner = _support_graph(_router()).compile()
    outer: StateGraph[S, Any, S, S] = StateGraph(S)
    outer.add_node("support", inner)
    outer.add_edge(START, "support")
    outer.add_edge("support", END)
    out = await outer.compile().ainvoke({"messages": [HumanMessage("my app crash")]})
    assert out["handled"] == ["technical"]


async def test_router_node_under_send_fan_out() -> None:
    graph = _support_graph(_router())
    graph.add_node("fan", lambda state: {})
    graph.add_conditional_edges(
        "fan", lambda state: [Send("route", {"messages": [m]}) for m in state["messages"]], ["route"]
    )
    graph.edges.discard((START, "route"))
    graph.add_edge(START, "fan")
    out = await graph.compile().ainvoke({"messages": [HumanMessage("refund me"), HumanMessage("it crashes")]})
    assert sorted(out["handled"]) == ["billing", "technical"]


# --- the policy gate -------------------------------------------------------------------------

executed: list[str] = []


@tool
def shell(command: str) -> str:
    """Run a shell command."""
    executed.append(command)
    return f"ran {command}"


def _gate_graph(router: Router, script: list[list[dict[str, Any]]]) -> StateGraph[S, Any, S, S]:
    turns = iter(script)

    def agent(state: S) -> dict[str, Any]:
        calls = next(turns, [])
        return {"messages": [AIMessage("", tool_calls=calls) if calls else AIMessage("done")]}

    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("agent", agent)
    graph.add_node("gate", policy_gate_node(router, "tools"), destinations=("tools", "agent"))
    graph.add_node("tools", ToolNode([shell]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", lambda s: "gate" if s["messages"][-1].tool_calls else END, ["gate", END])
    graph.add_edge("tools", "agent")
    return graph


def _call(command: str, call_id: str) -> dict[str, Any]:
    return {"name": "shell", "args": {"command": command}, "id": call_id, "type": "tool_call"}


def _no_orphans(messages: list[AnyMessage]) -> None:
    asked = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    assert asked == answered


@pytest.fixture(autouse=True)
def _clear_executed() -> None:
    executed.clear()


async def test_gate_allows_and_denies_per_call_without_orphans() -> None:
    app = _gate_graph(_router(), [[_call("ls", "a"), _call("rm -rf /data", "b")]]).compile()
    out = await app.ainvoke({"messages": [HumanMessage("clean up")]})
    assert executed == ["ls"]
    refusal = next(m for m in out["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "b")
    assert refusal.status == "error" and "Refused by policy 'tools'" in refusal.content
    assert "destructive" in refusal.content
    _no_orphans(out["messages"])
    assert out["messages"][-1].content == "done"


def test_gate_works_under_sync_invoke() -> None:
    app = _gate_graph(_router(), [[_call("ls", "a")]]).compile()
    out = app.invoke({"messages": [HumanMessage("list")]})
    assert executed == ["ls"]
    _no_orphans(out["messages"])


@pytest.mark.parametrize(("resume", "ran"), [("allow", ["truncate log"]), ("deny", [])])
async def test_gate_review_pauses_for_a_person(resume: str, ran: list[str]) -> None:
    app = _gate_graph(_router(), [[_call("truncate log", "r")]]).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"review-{resume}"}}
    paused = await app.ainvoke({"messages": [HumanMessage("shrink the log")]}, config)
    interrupt = paused["__interrupt__"][0].value
    assert interrupt["rule"] == "destructive" and interrupt["tool_call"]["id"] == "r"
    assert executed == []
    out = await app.ainvoke(Command(resume=resume), config)
    assert executed == ran
    _no_orphans(out["messages"])
    assert out["gate"][0]["by"] == "a person"


class _Recorded:
    """A decision sink that keeps every decision it is given."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    async def record(self, decision: Decision, *, state: State) -> None:
        del state
        self.decisions.append(decision)


def _counted_router() -> tuple[Router, ScriptedEngine, _Recorded]:
    policy = three_task_policy()
    engine, sink = ScriptedEngine(_keyword_script), _Recorded()
    return Router(lambda: policy, OneEngine(engine), Chats(None), sink=sink), engine, sink


@pytest.mark.parametrize("resume", ["allow", "deny"])
async def test_a_resumed_review_executes_the_reviewed_verdict_without_checking_again(
    resume: str, tmp_path: Path
) -> None:
    router, engine, sink = _counted_router()
    script = [[_call("truncate log", "r"), _call("ls", "a")]]
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "gate.db")) as saver:
        app = _gate_graph(router, script).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "review-once"}}
        paused = await app.ainvoke({"messages": [HumanMessage("shrink the log, then list")]}, config)
        assert paused["__interrupt__"][0].value["tool_call"]["id"] == "r"
        asked, recorded = len(engine.calls), len(sink.decisions)
        assert asked == 2 and {d.policy_version for d in sink.decisions}  # one engine call per tool call
        out = await app.ainvoke(Command(resume=resume), config)
    # LangGraph ran the gate again from the top on resume; the checks were not.
    assert (len(engine.calls), len(sink.decisions)) == (asked, recorded)
    assert executed == (["truncate log", "ls"] if resume == "allow" else ["ls"])
    assert [(g["tool_call_id"], g["by"]) for g in out["gate"]] == [("r", "a person"), ("a", "System 1")]
    _no_orphans(out["messages"])


def test_a_resumed_review_under_sync_invoke_does_not_check_again(tmp_path: Path) -> None:
    router, engine, sink = _counted_router()
    with SqliteSaver.from_conn_string(str(tmp_path / "gate.db")) as saver:
        app = _gate_graph(router, [[_call("truncate log", "r")]]).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "review-sync"}}
        app.invoke({"messages": [HumanMessage("shrink the log")]}, config)
        asked, recorded = len(engine.calls), len(sink.decisions)
        out = app.invoke(Command(resume="allow"), config)
    assert asked == 1 and (len(engine.calls), len(sink.decisions)) == (asked, recorded)
    assert executed == ["truncate log"] and out["gate"][0]["by"] == "a person"


async def test_the_gate_called_outside_a_graph_still_checks() -> None:
    router, engine, _ = _counted_router()
    gate = policy_gate_node(router, "tools")
    state = {"messages": [HumanMessage("list"), AIMessage("", tool_calls=[_call("ls", "a")])]}
    command = await gate.ainvoke(state)
    assert len(engine.calls) == 1 and command.update["gate"][0]["verdict"] == "allow"
    assert gate.invoke(state).update["gate"][0]["verdict"] == "allow"


def test_classify_node_feeds_conditional_edges() -> None:
    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    graph.add_node("classify", classify_node(_router(), "triage"))
    graph.add_node("pager", _agent("pager"))
    graph.add_node("queue", _agent("queue"))
    graph.add_edge(START, "classify")
    graph.add_conditional_edges(
        "classify", lambda s: "pager" if s["classification"]["urgent"] == "yes" else "queue", ["pager", "queue"]
    )
    app = graph.compile()
    assert app.invoke({"messages": [HumanMessage("site is down now")]})["handled"] == ["pager"]
    out = app.invoke({"messages": [HumanMessage("whenever you can")]})
    assert out["handled"] == ["queue"]
    assert out["classification"] == {"urgent": "no", "tone": "0"}


# --- the state the router node writes to, and states with nothing to route --------------------


def _counted() -> tuple[Router, ScriptedEngine]:
    policy = three_task_policy()
    engine = ScriptedEngine(_keyword_script)
    return Router(lambda: policy, OneEngine(engine), Chats(None)), engine


def _teams_on(state: type[Any], router: Router) -> StateGraph[Any, Any, Any, Any]:
    graph: StateGraph[Any, Any, Any, Any] = StateGraph(state)
    graph.add_node("route", router_node(router, "support"), destinations=("billing", "technical", "frontier"))
    for name in ("billing", "technical", "frontier"):
        graph.add_node(name, lambda state, name=name: {"messages": [AIMessage(f"{name} here")]})
        graph.add_edge(name, END)
    graph.add_edge(START, "route")
    return graph


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_router_node_refuses_a_state_that_would_drop_its_route(mode: str) -> None:
    # LangGraph keeps only the state's keys of an update: on MessagesState the route and the
    # decision would vanish, and every follow-up would be routed afresh. Refused before deciding.
    router, engine = _counted()
    app = _teams_on(MessagesState, router).compile()
    state = {"messages": [HumanMessage("I was charged twice")]}
    with pytest.raises(ConfigError, match=r"'route' and 'decision'.*no 'route' or 'decision'.*RouterState"):
        app.invoke(state) if mode == "invoke" else await app.ainvoke(state)
    assert engine.calls == []


def test_router_node_names_the_one_key_its_custom_state_lacks() -> None:
    class Partial(MessagesState, total=False):
        route: str | None

    with pytest.raises(ConfigError, match=r"state has no 'decision':"):
        _teams_on(Partial, _counted()[0]).compile().invoke({"messages": [HumanMessage("refund")]})


def test_router_state_keeps_the_route_across_turns_with_a_checkpointer() -> None:
    class Mine(RouterState, total=False):
        handled: Annotated[list[str], operator.add]

    app = _teams_on(Mine, _router()).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "sticky"}}
    first = app.invoke({"messages": [{"role": "user", "content": "I was charged twice"}]}, config)
    assert (first["route"], first["decision"]["reason"]) == ("billing", "confident")
    # A follow-up System 1 cannot place on its own stays on the conversation's route.
    out = app.invoke({"messages": [("user", "ok do it")]}, config)
    assert (out["route"], out["decision"]["reason"]) == ("billing", "sticky")
    assert out["messages"][-1].content == "billing here"


def test_a_plain_list_state_of_dict_messages_is_routed() -> None:
    class Plain(TypedDict, total=False):
        messages: list[Any]
        route: str | None
        decision: dict[str, Any]

    out = _teams_on(Plain, _router()).compile().invoke({"messages": [{"role": "user", "content": "refund please"}]})
    assert out["route"] == "billing"


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
async def test_router_node_and_edge_refuse_a_state_with_no_user_turn(mode: str) -> None:
    router, engine = _counted()
    node_app = _teams_on(RouterState, router).compile()
    edge_graph: StateGraph[Any, Any, Any, Any] = StateGraph(RouterState)
    edge_graph.add_node("billing", lambda state: {})
    edge_graph.add_node("frontier", lambda state: {})
    edge_graph.add_conditional_edges(START, route_edge(router, "support"), ["billing", "frontier"])
    edge_app = edge_graph.compile()
    cases = [
        ({"messages": []}, "messages", "is empty"),
        ({"messages": [AIMessage("How can I help?")]}, "messages", "has no user turn"),
        ({"messages": [HumanMessage("")]}, "messages.0", "no text"),
    ]
    for app in (node_app, edge_app):
        for state, where, why in cases:
            with pytest.raises(InvalidRequest, match=why) as raised:
                app.invoke(state) if mode == "invoke" else await app.ainvoke(state)
            assert raised.value.field == where
    assert engine.calls == []


def test_the_error_names_the_state_key_the_node_reads() -> None:
    node = router_node(_router(), "support", messages_key="history")
    with pytest.raises(InvalidRequest, match=r"has no user turn.*the graph state's 'history'") as raised:
        node.invoke({"history": [AIMessage("Hello")], "messages": [HumanMessage("refund")]})
    assert raised.value.field == "history"
    with pytest.raises(InvalidRequest, match="is empty") as missing:
        node.invoke({"messages": [HumanMessage("refund")]})
    assert missing.value.field == "history"
    # Outside a graph nothing is dropped, so nothing is checked: the command carries the update.
    command = router_node(_router(), "support").invoke({"messages": [HumanMessage("refund")]})
    assert command.goto == "billing" and command.update["route"] == "billing"


def test_classify_node_with_nothing_to_read_is_an_error() -> None:
    node = classify_node(_router(), "triage")
    with pytest.raises(InvalidRequest, match="no user turn, and the graph state no 'input'") as raised:
        node.invoke({"messages": [AIMessage("Hello")]})
    assert raised.value.field == "messages"
    assert node.invoke({"input": {"ticket": "site down now"}})["classification"]["urgent"] == "yes"
    assert node.invoke({"messages": [("user", "site is down now")]})["classification"]["urgent"] == "yes"
