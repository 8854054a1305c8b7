"""The router from sync code: the same decisions as the async path, made in the caller's thread where they can be.

``Router.route_sync`` (and ``classify_sync``, ``check_sync``) run the same plan as the async
methods. These tests check that each decision is field for field the async one, that the common
case (System 1 answers, no sink or a write-behind log) never hops to the private loop thread, and
that what needs the event loop (System 2, a durable commit, an engine with no sync path) still
works through it. Hops are counted by wrapping ``LoopThread.run``; nothing else is patched.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Annotated, Any, TypedDict

import httpx2
import pytest
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langgraph.graph import END, START, StateGraph, add_messages

from fastslow.api.store import DecisionStore
from fastslow.engines.jev import JevEngine
from fastslow.router import (
    Decision,
    EngineHTTPError,
    EngineTimeout,
    Noul,
    OpenEnded,
    PolicySet,
    Question,
    Router,
    State,
    policy_gate_node,
    request_scope,
    route_edge,
    router_node,
)
from fastslow.router._nodes import decision_record
from fastslow.router._sync import LoopThread
from fastslow.router.engine_api import ChatResult, CoalescingEngine, current_deadline
from fastslow.router.settings import CoalesceSettings, JevSettings

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedChat, ScriptedEngine, SyncScriptedEngine

Script = Callable[[State, str, Question], Any]


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every coroutine the sync path sent to the loop thread, by name."""
    seen: list[str] = []
    real = LoopThread.run

    def counted(coro: Any) -> Any:
        seen.append(coro.__qualname__)
        return real(coro)

    monkeypatch.setattr(LoopThread, "run", counted)
    return seen


def _same(a: Decision, b: Decision) -> None:
    left, right = decision_record(a), decision_record(b)
    for record in (left, right):
        del record["id"], record["latency_ms"]
    assert left == right


def _routes(dist: Mapping[str, float], open_ended: float = 0.05) -> Script:
    def script(state: State, name: str, question: Question) -> Any:
        if name.endswith(".open_ended"):
            return {"yes": open_ended, "no": 1 - open_ended}
        return dist

    return script


def _always(option: str) -> ScriptedChat:
    return ScriptedChat(
        respond=lambda messages, schema: ChatResult(content="", model="f-1", structured={"answer": option})
    )


def _router(
    script: Script, chat: ScriptedChat | None = None, policy: PolicySet | None = None, sink: Any = None
) -> tuple[Router, SyncScriptedEngine]:
    engine = SyncScriptedEngine(script)
    the_policy = policy or three_task_policy()
    return Router(lambda: the_policy, OneEngine(engine), Chats(chat), sink=sink), engine


def _both(router: Router, call: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The async method's result, then the sync one's, for the same arguments."""
    awaited = asyncio.run(getattr(router, call)(*args, **kwargs))
    return awaited, getattr(router, f"{call}_sync")(*args, **kwargs)


MESSAGES: list[BaseMessage] = [HumanMessage("I was charged twice")]

ROUTE_CASES: dict[str, tuple[Script, dict[str, Any], str]] = {
    # name: (engine script, route() arguments, the reason expected)
    "confident": (_routes({"billing": 0.9, "technical": 0.05, "other": 0.05}), {}, "confident"),
    "low confidence": (_routes({"billing": 0.4, "technical": 0.35, "other": 0.25}), {}, "low_confidence"),
    "none of these": (_routes({"billing": 0.05, "technical": 0.05, "other": 0.9}), {}, "none_of_these"),
    "engine error": (lambda s, n, q: EngineHTTPError(503, "down", engine="scripted"), {}, "engine_error"),
    "timeout": (lambda s, n, q: EngineTimeout("slow", engine="scripted"), {}, "timeout"),
    "no answer": (lambda s, n, q: "refused", {}, "no_answer"),
    "sticky": (_routes({"billing": 0.15, "technical": 0.75, "other": 0.1}), {"previous": "billing"}, "sticky"),
}


@pytest.mark.parametrize("case", ROUTE_CASES)
def test_route_sync_decides_as_route_does(case: str, hops: list[str]) -> None:
    script, kwargs, reason = ROUTE_CASES[case]
    router, engine = _router(script, _always("technical"))
    awaited, synced = _both(router, "route", "support", MESSAGES, **kwargs)
    _same(awaited, synced)
    assert synced.reason == reason
    assert (engine.async_calls, engine.sync_calls) == (1, 1)
    # Only System 2 needs the loop thread; what System 1 settles never leaves this thread.
    assert len(hops) == (1 if synced.system == 2 else 0), (hops, synced)


def test_open_ended_requests_escalate_without_system_2_in_both(hops: list[str]) -> None:
    policy = three_task_policy(open_ended=OpenEnded(threshold=0.5))
    router, _ = _router(_routes({"billing": 0.9, "technical": 0.05, "other": 0.05}, open_ended=0.8), policy=policy)
    awaited, synced = _both(router, "route", "support", MESSAGES)
    _same(awaited, synced)
    assert (synced.reason, synced.outcome, hops) == ("open_ended", None, [])


def test_shadow_mode_asks_the_incumbent_on_the_loop_thread(hops: list[str]) -> None:
    policy = three_task_policy(mode="shadow")
    router, _ = _router(_routes({"billing": 0.9, "technical": 0.05, "other": 0.05}), policy=policy)

    async def incumbent(name: str) -> str | None:
        return "technical"

    awaited, synced = _both(router, "route", "support", MESSAGES, incumbent=incumbent)
    _same(awaited, synced)
    assert (synced.outcome, synced.reason, synced.model) == ("technical", "shadow", "incumbent")
    assert len(hops) == 1


def test_classify_sync_escalates_only_the_unsure_question(hops: list[str]) -> None:
    def script(state: State, name: str, question: Question) -> Any:
        return {"yes": 0.95, "no": 0.05} if name.endswith("urgent") else {"0": 0.4, "1": 0.35, "2": 0.25}

    router, engine = _router(script, _always("1"))  # a score's options are its levels' indices
    awaited, synced = _both(router, "classify", "triage", "the app crashed again")
    assert list(synced) == list(awaited) == ["urgent", "tone"]
    for name in synced:
        _same(awaited[name], synced[name])
    assert (synced["urgent"].system, synced["tone"].system, synced["tone"].outcome) == (1, 2, "1")
    assert engine.sync_calls == 1 and len(hops) == 1


@pytest.mark.parametrize(
    ("dist", "verdict", "loop"),
    [
        ({"yes": 0.05, "no": 0.95}, "allow", 0),
        ({"yes": 0.95, "no": 0.05}, "deny", 0),
        ({"yes": 0.5, "no": 0.5}, "review", 0),
    ],
)
def test_check_sync_gives_the_async_verdict(dist: dict[str, float], verdict: str, loop: int, hops: list[str]) -> None:
    router, _ = _router(lambda s, n, q: dist)
    awaited, synced = _both(router, "check", "tools", {"tool": "shell", "arguments": {"cmd": "ls"}})
    assert (awaited.verdict, awaited.rule) == (synced.verdict, synced.rule)
    assert synced.verdict == verdict
    for name in synced.decisions:
        _same(awaited.decisions[name], synced.decisions[name])
    assert len(hops) == loop


def test_check_sync_asks_system_2_when_a_rule_fails_open_to_it(hops: list[str]) -> None:
    policy = three_task_policy()
    tools = policy.tasks["tools"]
    escalating = PolicySet(
        tasks={**policy.tasks, "tools": replace(tools, on_failure="escalate")},  # type: ignore[type-var]
        version=policy.version,
        egress_allow=policy.egress_allow,
    )
    router, _ = _router(lambda s, n, q: EngineTimeout("slow", engine="scripted"), _always("no"), policy=escalating)
    awaited, synced = _both(router, "check", "tools", "rm -rf /tmp/cache")
    assert synced.verdict == awaited.verdict == "allow"
    assert synced.system2 and len(hops) == 1


class _AsyncOnly(ScriptedEngine):
    """An engine without ``decide_sync``: sync callers reach it through the loop thread."""


def test_an_engine_without_a_sync_path_is_asked_on_the_loop_thread(hops: list[str]) -> None:
    engine = _AsyncOnly(_routes({"billing": 0.9, "technical": 0.05, "other": 0.05}))
    policy = three_task_policy()
    router = Router(lambda: policy, OneEngine(engine), Chats(None))
    decision = router.route_sync("support", MESSAGES)
    assert decision.outcome == "billing" and len(engine.calls) == 1
    assert len(hops) == 1


class _Sink:
    """A sink recording both ways; ``from_thread`` says whether its thread path takes the decisions."""

    def __init__(self, from_thread: bool) -> None:
        self.from_thread = from_thread
        self.recorded: list[tuple[str, str]] = []
        self.loops: list[str] = []

    async def record(self, decision: Decision, *, state: State) -> None:
        self.recorded.append((decision.outcome or "", "awaited"))
        self.loops.append(threading.current_thread().name)

    def record_from_thread(self, decisions: Sequence[Decision], *, state: State) -> bool:
        if not self.from_thread:
            return False
        self.recorded.extend((d.outcome or "", "queued") for d in decisions)
        return True


@pytest.mark.parametrize("from_thread", [True, False], ids=["queued", "refused"])
def test_a_sink_that_cannot_queue_from_a_thread_is_awaited_on_the_loop_thread(
    from_thread: bool, hops: list[str]
) -> None:
    sink = _Sink(from_thread)
    router, _ = _router(_routes({"billing": 0.9, "technical": 0.05, "other": 0.05}), sink=sink)
    router.route_sync("support", MESSAGES)
    if from_thread:
        assert (sink.recorded, hops) == ([("billing", "queued")], [])
    else:
        assert sink.recorded == [("billing", "awaited")] and len(hops) == 1
        assert sink.loops == ["fastslow-sync"]


def test_the_loop_thread_runs_in_the_callers_context() -> None:
    async def deadline_left() -> float | None:
        deadline = current_deadline()
        return None if deadline is None else deadline.remaining

    with request_scope(timeout_s=30.0):
        left = LoopThread.run(deadline_left())
    assert left is not None and 25.0 < left <= 30.0
    assert LoopThread.run(deadline_left()) is None


def test_the_loop_thread_raises_the_coroutines_error() -> None:
    async def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        LoopThread.run(fails())


# --- the coalescing wrapper ------------------------------------------------------------------


def test_coalescing_passes_a_sync_call_through_while_nothing_is_in_flight() -> None:
    inner = SyncScriptedEngine(lambda s, n, q: {"yes": 0.9, "no": 0.1})
    coalescing = CoalescingEngine(inner)
    reply = coalescing.decide_sync("x", {"q": Noul(instructions="?")})
    assert reply is not None and inner.sync_calls == 1 and coalescing.calls_sent == 1


def test_coalescing_sends_sync_calls_to_decide_when_it_caches_or_the_engine_cannot() -> None:
    question = {"q": Noul(instructions="?")}
    cached = CoalescingEngine(SyncScriptedEngine(lambda s, n, q: {"yes": 0.9}), CoalesceSettings(cache_ttl_s=5.0))
    assert cached.decide_sync("x", question) is None
    no_sync = CoalescingEngine(ScriptedEngine(lambda s, n, q: {"yes": 0.9}))
    assert no_sync.decide_sync("x", question) is None


# --- the decision log from a sync caller --------------------------------------------------------


@pytest.fixture
def store_on_loop_thread(database_url: str) -> Iterator[DecisionStore]:  # noqa: F811
    """A decision log opened (and closed) on the loop thread, where sync callers' async steps run."""
    store = LoopThread.run(DecisionStore.open(database_url))
    try:
        yield store
    finally:
        LoopThread.run(store.aclose())


def test_route_sync_queues_write_behind_decisions_without_the_loop_thread(
    store_on_loop_thread: DecisionStore, hops: list[str]
) -> None:
    store = store_on_loop_thread
    router, _ = _router(_routes({"billing": 0.9, "technical": 0.05, "other": 0.05}))
    logged = router.with_sink(store.sink("acme", write_behind=True))
    first = logged.route_sync("support", MESSAGES)
    assert len(hops) == 1  # the writer starts on the loop thread with the first record
    rest = [logged.route_sync("support", [HumanMessage(f"order {i}")]) for i in range(20)]
    assert len(hops) == 1
    LoopThread.run(store.flush())
    for decision in [first, *rest]:
        stored = LoopThread.run(store.get(decision.id, tenant="acme"))
        assert stored is not None and stored.outcome == "billing"


def test_system_2_answers_and_durable_sinks_commit_before_route_sync_returns(
    store_on_loop_thread: DecisionStore, hops: list[str]
) -> None:
    store = store_on_loop_thread
    router, _ = _router(_routes({"billing": 0.4, "technical": 0.35, "other": 0.25}), _always("technical"))
    behind = router.with_sink(store.sink("acme", write_behind=True))
    escalated = behind.route_sync("support", MESSAGES)
    assert escalated.system == 2
    # Committed, not queued: readable at once, with no flush.
    assert LoopThread.run(store.get(escalated.id, tenant="acme")) is not None
    confident, _ = _router(_routes({"billing": 0.9, "technical": 0.05, "other": 0.05}))
    durable = confident.with_sink(store.sink("acme"))
    kept = durable.route_sync("support", MESSAGES)
    assert LoopThread.run(store.get(kept.id, tenant="acme")) is not None
    record = "Router._record.<locals>.run"
    assert [h for h in hops if not h.startswith("DecisionStore.")] == ["Router._escalate", record, record]


# --- the nodes under invoke ------------------------------------------------------------------------


class G(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    route: str | None
    decision: Any
    gate: Any


def test_graph_invoke_decides_in_the_callers_thread_with_a_sync_jev_client(hops: list[str]) -> None:
    def reply(request: httpx2.Request) -> httpx2.Response:
        questions = json.loads(request.content)["questions"]
        answers = {
            name: {
                "type": "choice",
                "choice": "billing",
                "probabilities": {"billing": 0.9, "technical": 0.05, "other": 0.05},
            }
            if q["type"] == "choice"
            else {"type": "noul", "noul": 0.02}
            for name, q in questions.items()
        }
        return httpx2.Response(200, json={"model": "jev-1", "answers": answers})

    def never(request: httpx2.Request) -> httpx2.Response:
        raise AssertionError("the async client was used under invoke")

    engine = JevEngine(
        JevSettings(base_url="http://jev.test", profile="jev"),
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(never)),
        sync_http_client=httpx2.Client(transport=httpx2.MockTransport(reply)),
    )
    policy = three_task_policy()
    router = Router(lambda: policy, OneEngine(engine), Chats(None))

    def agent(state: G) -> dict[str, Any]:
        return {"messages": [AIMessage("", tool_calls=[{"id": "c1", "name": "shell", "args": {"cmd": "ls"}}])]}

    graph: StateGraph[G, Any, G, G] = StateGraph(G)
    graph.add_node(
        "route", router_node(router, "support", escalate_to="other"), destinations=("billing", "technical", "other")
    )
    graph.add_node("billing", agent)
    graph.add_node("technical", agent)
    graph.add_node("other", agent)
    graph.add_node(
        "gate", policy_gate_node(router, "tools", tools="tools", agent="done"), destinations=("tools", "done")
    )
    graph.add_node("tools", lambda state: {})
    graph.add_node("done", lambda state: {})
    graph.add_edge(START, "route")
    for name in ("billing", "technical", "other"):
        graph.add_edge(name, "gate")
    graph.add_edge("tools", "done")
    graph.add_edge("done", END)
    out = graph.compile().invoke({"messages": [HumanMessage("refund me")]})
    assert out["route"] == "billing" and out["decision"]["system"] == 1
    assert [g["verdict"] for g in out["gate"]] == ["allow"]

    edge_graph: StateGraph[G, Any, G, G] = StateGraph(G)
    edge_graph.add_node("billing", lambda state: {"route": "billing"})
    edge_graph.add_node("other", lambda state: {"route": "other"})
    edge_graph.add_conditional_edges(START, route_edge(router, "support", escalate_to="other"), ["billing", "other"])
    edge_graph.add_edge("billing", END)
    edge_graph.add_edge("other", END)
    assert edge_graph.compile().invoke({"messages": [HumanMessage("refund me")]})["route"] == "billing"
    assert hops == []


def test_a_sync_call_from_the_loop_thread_itself_is_refused_not_deadlocked() -> None:
    async def nested() -> None:
        async def inner() -> None:
            return None

        LoopThread.run(inner())

    with pytest.raises(RuntimeError, match="own loop thread"):
        LoopThread.run(nested())
