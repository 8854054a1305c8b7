"""Shadow mode: System 1 answers and is logged, the incumbent decides; `fastslow report shadow` reads the log."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.store import DecisionStore
from fastslow.policies import parse_policy
from fastslow.router import EngineHTTPError, Question, Router, State, router_node
from fastslow.router.engine_api import ChatResult

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedChat, ScriptedEngine

runner = CliRunner()


def _script(dist: dict[str, float] | Exception) -> Any:
    def script(state: State, name: str, question: Question) -> Any:
        if name.endswith(".open_ended"):
            return {"yes": 0.05, "no": 0.95}
        if name.startswith("tools."):
            return {"yes": 0.95, "no": 0.05}
        return dist

    return script


def _router(dist: dict[str, float] | Exception, chat: ScriptedChat | None = None, sink: Any = None) -> Router:
    policy = three_task_policy(mode="shadow")
    tools = dataclasses.replace(policy.tasks["tools"], mode="shadow")
    policy = dataclasses.replace(policy, tasks={**policy.tasks, "tools": tools})
    return Router(lambda: policy, OneEngine(ScriptedEngine(_script(dist))), Chats(chat), sink=sink)


async def test_the_incumbent_decides_and_system_1_is_kept_beside_it() -> None:
    chat = ScriptedChat()
    router = _router({"billing": 0.9, "technical": 0.05, "other": 0.05}, chat)

    async def incumbent(name: str) -> str | None:
        assert name == "support"
        return "technical"

    decision = await router.route("support", [HumanMessage("I was charged twice")], incumbent=incumbent)
    assert (decision.outcome, decision.reason, decision.system) == ("technical", "shadow", 2)
    assert decision.probabilities["billing"] == 0.9  # System 1's distribution, for the report
    assert "would have billing" in decision.detail
    assert chat.calls == []


async def test_without_a_callback_system_2_is_the_incumbent() -> None:
    chat = ScriptedChat(replies=[ChatResult(content="", model="frontier-1", structured={"answer": "technical"})])
    router = _router({"billing": 0.9, "technical": 0.05, "other": 0.05}, chat)
    decision = await router.route("support", [HumanMessage("I was charged twice")])
    assert (decision.outcome, decision.system, decision.reason) == ("technical", 2, "shadow")
    assert len(chat.calls) == 1


async def test_a_shadow_check_takes_the_incumbents_verdict() -> None:
    router = _router({"billing": 0.9, "technical": 0.05, "other": 0.05})

    async def allow_all(rule: str) -> str | None:
        return "allow"

    result = await router.check("tools", "rm -rf /", incumbent=allow_all)
    assert result.verdict == "allow"  # System 1 would have denied: p(yes) = 0.95
    assert all(d.reason == "shadow" and d.probabilities["yes"] == 0.95 for d in result.decisions.values())
    silent = await router.check("tools", "rm -rf /")  # no System 2 either: nobody judged, so deny
    assert silent.verdict == "deny"


class S(TypedDict, total=False):
    messages: list[Any]
    route: str | None
    decision: dict[str, Any]
    handled: list[str]


@pytest.mark.parametrize(
    "system1",
    [
        {"billing": 0.95, "technical": 0.03, "other": 0.02},
        {"billing": 0.4, "technical": 0.35, "other": 0.25},
        {"other": 0.9, "billing": 0.05, "technical": 0.05},
        EngineHTTPError(503, "engine down"),
    ],
)
async def test_shadow_decisions_never_change_where_the_graph_goes(system1: dict[str, float] | Exception) -> None:
    async def existing_router(state: Any, name: str) -> str | None:
        text = state["messages"][-1].content
        return "technical" if "crash" in text else "billing"

    graph: StateGraph[S, Any, S, S] = StateGraph(S)
    node = router_node(_router(system1), "support", incumbent=existing_router)
    graph.add_node("route", node, destinations=("billing", "technical", "frontier"))
    for name in ("billing", "technical", "frontier"):
        graph.add_node(name, lambda state, name=name: {"handled": [name]})
        graph.add_edge(name, END)
    graph.add_edge(START, "route")
    compiled = graph.compile()
    for text, expected in (("the app crashes", "technical"), ("refund please", "billing")):
        out = await compiled.ainvoke({"messages": [HumanMessage(text)]})
        assert out["handled"] == [expected] and out["route"] == expected


SHADOW_POLICY = """\
tasks:
  support:
    kind: route
    mode: shadow
    routes:
      billing: Charges.
      technical: Errors.
    none_of_these: other
    thresholds: {min_confidence: 0.8}
"""


def test_report_shadow_says_what_system_1_would_have_kept(
    database_url: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(SHADOW_POLICY, encoding="utf-8")
    assert parse_policy(SHADOW_POLICY).tasks["support"].mode == "shadow"

    async def run() -> None:
        store = await DecisionStore.open(database_url)
        try:
            router = _router({"billing": 0.9, "technical": 0.05, "other": 0.05}, sink=store.sink("acme"))
            for i in range(40):
                answer = "billing" if i % 4 else "technical"  # System 1 agrees three times in four

                async def incumbent(name: str, answer: str = answer) -> str | None:
                    return answer

                await router.route("support", [HumanMessage(f"message {i}")], incumbent=incumbent)
        finally:
            await store.aclose()

    asyncio.run(run())
    result = runner.invoke(app, ["report", "shadow", "--policy", str(policy_path), "--task", "support"])
    assert result.exit_code == 0, result.output
    assert "40 shadow decisions" in result.output
    assert "agreed with the incumbent on 75.0% of 40" in result.output
    assert "would have kept 100.0% (40) at 75.0%" in result.output
    assert "remove mode: shadow" in result.output
