"""In-process graphs paused at a policy gate, their reviews in the decision log's queue (SQLite and PostgreSQL):
the gate opens the review once, a person settles it, ``resume_reviewed`` resumes the thread with the
settled value and the reviewed call runs (or is refused); the ``create_agent`` middleware alike."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from fastslow.api.store import DecisionStore, Review
from fastslow.graphs import resume_reviewed, resume_value, waiting_reviews
from fastslow.graphs.middleware import GATE_KEY, PolicyGateMiddleware
from fastslow.router import Router, policy_gate_node
from fastslow.router._sync import LoopThread

from fakes.chat_models import ScriptedChatModel, call, keyword_script
from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedEngine

ran: list[str] = []


@tool
def shell(command: str) -> str:
    """Run a shell command."""
    ran.append(command)
    return f"ran {command}"


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


def _router(store: DecisionStore) -> tuple[Router, ScriptedEngine]:
    """The three-task policy; System 1 is 0.5 sure ``truncate`` is destructive (review), sure ``ls`` is not."""
    policy, engine = three_task_policy(), ScriptedEngine(keyword_script)
    router = Router(lambda: policy, OneEngine(engine), Chats(None))
    return router.with_sink(store.sink("acme", write_behind=True, review_ttl_s=600)), engine


class _State(MessagesState):
    gate: list[dict[str, Any]]


def _gate_graph(router: Router, *calls: dict[str, Any]) -> Any:
    turns = iter([list(calls)])

    def agent(state: _State) -> dict[str, Any]:
        proposed = next(turns, [])
        return {"messages": [AIMessage("", tool_calls=proposed) if proposed else AIMessage("done")]}

    graph: StateGraph[_State, Any, _State, _State] = StateGraph(_State)
    graph.add_node("agent", agent)
    graph.add_node("gate", policy_gate_node(router, "tools"), destinations=("tools", "agent"))
    graph.add_node("tools", ToolNode([shell]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", lambda s: "gate" if s["messages"][-1].tool_calls else END, ["gate", END])
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


async def _only_review(store: DecisionStore) -> Review:
    [review] = await store.reviews(tenant="acme")
    return review


async def test_a_gate_review_is_queued_settled_and_resumed_and_the_call_runs(store: DecisionStore) -> None:
    router, engine = _router(store)
    app = _gate_graph(router, call("shell", "r", command="truncate log"), call("shell", "a", command="ls"))
    config = {"configurable": {"thread_id": "thread-graph"}}
    paused = await app.ainvoke({"messages": [HumanMessage("shrink the log, then list")]}, config)
    [interrupt] = paused["__interrupt__"]
    review = await _only_review(store)
    assert interrupt.value["review_id"] == review.id and ran == []
    assert (review.source, review.thread_id, review.tool_call_id, review.rule) == (
        "graph",
        "thread-graph",
        "r",
        "destructive",
    )
    assert review.subject == {"tool_call": {"name": "shell", "args": {"command": "truncate log"}}}
    assert review.probabilities == {"destructive": 0.5, "exfiltration": 0.02}
    assert [w.review_ids for w in waiting_reviews((await app.aget_state(config)).interrupts)] == [(review.id,)]

    assert await resume_reviewed(app, config, store, tenant="acme") is None  # pending: nothing resumed
    settled = await store.settle_review(review.id, tenant="acme", verdict="allow", by="key-1")
    assert settled is not None and resume_value(settled.review) == "allow"
    asked = len(engine.calls)
    out = await resume_reviewed(app, config, store, tenant="acme")

    assert ran == ["truncate log", "ls"]
    assert [(g["tool_call_id"], g["verdict"], g["by"]) for g in out["gate"]] == [
        ("r", "allow", "a person"),
        ("a", "allow", "System 1"),
    ]
    assert len(engine.calls) == asked  # the gate ran again on resume; its checks did not
    assert len(await store.reviews(tenant="acme")) == 1  # nor was the review opened again
    with pytest.raises(ValueError, match="not paused"):
        await resume_reviewed(app, config, store, tenant="acme")


async def test_a_denied_gate_review_refuses_the_call(store: DecisionStore) -> None:
    router, _ = _router(store)
    app = _gate_graph(router, call("shell", "r", command="truncate log"))
    config = {"configurable": {"thread_id": "thread-deny"}}
    await app.ainvoke({"messages": [HumanMessage("shrink the log")]}, config)
    review = await _only_review(store)
    await store.settle_review(review.id, tenant="acme", verdict="deny", by="key-1")

    async def lookup(review_id: str) -> Review | None:  # as a client reading GET /v1/reviews/{id} would
        return await store.get_review(review_id, tenant="acme")

    out = await resume_reviewed(app, config, lookup)
    assert ran == []
    refusal = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert refusal.status == "error" and "decided by a person" in refusal.text


def test_a_sync_graph_opens_its_review_once_too(database_url: str) -> None:  # noqa: F811
    # A sync program's store lives on fastslow's loop thread, where its sync router records.
    on_loop = LoopThread.run
    store = on_loop(DecisionStore.open(database_url))
    try:
        router, engine = _router(store)
        app = _gate_graph(router, call("shell", "r", command="truncate log"))
        config = {"configurable": {"thread_id": "thread-sync"}}
        paused = app.invoke({"messages": [HumanMessage("shrink the log")]}, config)
        [review] = on_loop(store.reviews(tenant="acme"))
        assert paused["__interrupt__"][0].value["review_id"] == review.id and review.thread_id == "thread-sync"
        on_loop(store.settle_review(review.id, tenant="acme", verdict="allow", by="key-1"))
        # Paused under invoke, resumed under ainvoke: the check made before the pause is found.
        on_loop(resume_reviewed(app, config, store, tenant="acme"))
        assert ran == ["truncate log"] and len(engine.calls) == 1
        assert len(on_loop(store.reviews(tenant="acme"))) == 1
    finally:
        on_loop(store.aclose())


@pytest.mark.parametrize(
    ("verdict", "note", "ran_after", "answer"),
    [
        ("allow", None, ["ls", "truncate log"], "ran truncate log"),
        ("deny", "not on a Friday", ["ls"], "not on a Friday"),
    ],
)
async def test_the_agent_middleware_resumes_with_the_settled_human_in_the_loop_decision(
    store: DecisionStore, verdict: str, note: str | None, ran_after: list[str], answer: str
) -> None:
    router, _ = _router(store)
    proposes = AIMessage("", tool_calls=[call("shell", "r", command="truncate log"), call("shell", "a", command="ls")])
    model = ScriptedChatModel(label="m", script=[proposes, AIMessage("finished")])
    agent = create_agent(
        model, tools=[shell], middleware=[PolicyGateMiddleware(router, "tools")], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": f"agent-{verdict}"}}
    paused = await agent.ainvoke({"messages": [HumanMessage("make some room")]}, config)
    [action] = paused["__interrupt__"][0].value["action_requests"]
    review = await _only_review(store)
    assert action["fastslow"]["review_id"] == review.id
    assert (review.source, review.thread_id, review.tool_call_id) == ("agent", f"agent-{verdict}", "r")

    settled = await store.settle_review(review.id, tenant="acme", verdict=verdict, by="key-1", note=note)  # type: ignore[arg-type]
    assert settled is not None
    expected = {"type": "approve"} if verdict == "allow" else {"type": "reject", "message": note}
    assert resume_value(settled.review) == expected
    out = await resume_reviewed(agent, config, store, tenant="acme")

    assert sorted(ran) == sorted(ran_after)
    reviewed = next(m for m in out["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == "r")
    assert answer in reviewed.text
    record = next(g for g in out[GATE_KEY] if g["tool_call_id"] == "r")
    assert (record["verdict"], record["by"]) == (verdict, "a person")
    assert len(await store.reviews(tenant="acme")) == 1
