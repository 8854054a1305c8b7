"""The Router facade: System 1 first, System 2 for the rest, with egress and multi-turn rules."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from fastslow.router import (
    CheckTask,
    ConfigError,
    Decision,
    Egress,
    EngineHTTPError,
    EngineTimeout,
    OpenEnded,
    PolicySet,
    Question,
    Router,
    State,
    ToolCall,
)
from fastslow.router.engine_api import ChatResult

from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedChat, ScriptedEngine


def _router(
    script: Any, chat: ScriptedChat | None = None, policy: PolicySet | None = None, sink: Any = None
) -> tuple[Router, ScriptedEngine]:
    engine = ScriptedEngine(script)
    the_policy = policy or three_task_policy()
    return Router(lambda: the_policy, OneEngine(engine), Chats(chat), sink=sink), engine


def _route(dist: Mapping[str, float]) -> Any:
    def script(state: State, name: str, question: Question) -> Any:
        if name.endswith(".open_ended"):
            return {"yes": 0.05, "no": 0.95}
        return dist

    return script


def _answer_with(option: str) -> ChatResult:
    return ChatResult(content="", model="frontier-1", structured={"answer": option})


async def test_confident_route_stays_on_system_1() -> None:
    chat = ScriptedChat()
    router, engine = _router(_route({"billing": 0.9, "technical": 0.05, "other": 0.05}), chat)
    decision = await router.route("support", [HumanMessage("I was charged twice")])
    assert (decision.outcome, decision.system, decision.reason) == ("billing", 1, "confident")
    assert decision.policy_version == "sha256:test"
    assert chat.calls == []
    assert engine.calls[0][0] == "I was charged twice"


async def test_low_confidence_asks_system_2_with_options_as_an_enum() -> None:
    chat = ScriptedChat(replies=[_answer_with("technical")])
    router, _ = _router(_route({"billing": 0.4, "technical": 0.35, "other": 0.25}), chat)
    decision = await router.route("support", [HumanMessage("the app is weird with my card")])
    assert (decision.outcome, decision.system, decision.reason) == ("technical", 2, "low_confidence")
    schema = chat.calls[0]["schema"]
    assert schema["properties"]["answer"]["enum"] == ["billing", "technical", "other"]


async def test_system_2_answering_outside_the_options_leaves_it_escalated() -> None:
    chat = ScriptedChat(replies=[_answer_with("sales")])
    router, _ = _router(_route({"billing": 0.4, "technical": 0.35, "other": 0.25}), chat)
    decision = await router.route("support", [HumanMessage("hmm")])
    assert decision.outcome is None and decision.escalate
    assert "outside the options" in decision.detail


async def test_none_of_these_escalates() -> None:
    chat = ScriptedChat(replies=[_answer_with("billing")])
    router, _ = _router(_route({"billing": 0.05, "technical": 0.05, "other": 0.9}), chat)
    decision = await router.route("support", [HumanMessage("what's the weather")])
    assert (decision.reason, decision.system, decision.outcome) == ("none_of_these", 2, "billing")


async def test_open_ended_requests_go_straight_to_system_2() -> None:
    policy = three_task_policy(open_ended=OpenEnded(threshold=0.6))

    def script(state: State, name: str, question: Question) -> Any:
        return (
            {"yes": 0.9, "no": 0.1}
            if name == "support.open_ended"
            else {"billing": 0.95, "technical": 0.03, "other": 0.02}
        )

    chat = ScriptedChat()
    router, engine = _router(script, chat, policy)
    decision = await router.route("support", [HumanMessage("write me a poem about invoices")])
    assert (decision.reason, decision.escalate, decision.outcome) == ("open_ended", True, None)
    assert engine.calls[0][1] == ["support", "support.open_ended"]  # one System-1 call
    assert chat.calls == []  # the frontier node does the work, not a typed question


async def test_no_frontier_model_is_a_clear_escalated_outcome() -> None:
    router, _ = _router(_route({"billing": 0.4, "technical": 0.35, "other": 0.25}), None)
    decision = await router.route("support", [HumanMessage("hmm")])
    assert decision.escalate and decision.outcome is None
    assert "no frontier model configured" in decision.detail


async def test_engine_errors_and_timeouts_escalate_without_crashing() -> None:
    chat = ScriptedChat(replies=[_answer_with("billing"), _answer_with("technical")])
    router, _ = _router(lambda *a: EngineHTTPError(503, "overloaded", engine="jev"), chat)
    decision = await router.route("support", [HumanMessage("refund")])
    assert (decision.reason, decision.system, decision.outcome) == ("engine_error", 2, "billing")
    assert "503" in decision.detail
    router, _ = _router(lambda *a: EngineTimeout("budget spent"), chat)
    decision = await router.route("support", [HumanMessage("refund")])
    assert (decision.reason, decision.outcome) == ("timeout", "technical")


async def test_a_timeout_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    # asyncio's TimeoutError has no text: the log line says what kind of failure it was.
    router, _ = _router(lambda *a: TimeoutError(), None)
    with caplog.at_level(logging.WARNING, logger="fastslow.router"):
        decision = await router.route("support", [HumanMessage("refund")])
    assert decision.reason == "timeout"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "fastslow.router"]
    assert line.endswith(": timed out"), line


async def test_local_only_tasks_escalate_only_to_allow_listed_hosts() -> None:
    policy = three_task_policy(egress=Egress(local_only=True))
    outside = ScriptedChat(replies=[_answer_with("billing")], base_url="https://api.openai.com/v1")
    router, _ = _router(_route({"billing": 0.4, "technical": 0.35, "other": 0.25}), outside, policy)
    decision = await router.route("support", [HumanMessage("card issue")])
    assert decision.outcome is None and "egress denied" in decision.detail
    assert outside.calls == []
    inside = ScriptedChat(replies=[_answer_with("billing")], base_url="http://10.0.0.5:8000/v1")
    router, _ = _router(_route({"billing": 0.4, "technical": 0.35, "other": 0.25}), inside, policy)
    assert (await router.route("support", [HumanMessage("card issue")])).outcome == "billing"


async def test_follow_ups_keep_the_previous_route_unless_system_1_is_sure() -> None:
    chat = ScriptedChat(replies=[_answer_with("technical")])
    history = [HumanMessage("I was charged twice"), AIMessage("I can refund one charge."), HumanMessage("do it")]
    router, engine = _router(_route({"billing": 0.3, "technical": 0.4, "other": 0.3}), chat)
    decision = await router.route("support", history, previous="billing")
    assert (decision.outcome, decision.reason, decision.system) == ("billing", "sticky", 1)
    assert chat.calls == []
    # System 1 reads the current turn alone (tests/test_router_context.py has the earlier turns' rules).
    assert engine.calls[0][0] == "do it"
    router, _ = _router(_route({"billing": 0.02, "technical": 0.95, "other": 0.03}), chat)
    changed = await router.route("support", [HumanMessage("now the app crashes")], previous="billing")
    assert (changed.outcome, changed.reason) == ("technical", "confident")


async def test_a_sure_but_not_sure_enough_change_stays_sticky() -> None:
    router, _ = _router(_route({"billing": 0.1, "technical": 0.8, "other": 0.1}), ScriptedChat())
    decision = await router.route("support", [HumanMessage("and the other thing")], previous="billing")
    assert decision.reason == "sticky" and decision.outcome == "billing"


def _rules(destructive: float, exfiltration: float) -> Any:
    def script(state: State, name: str, question: Question) -> Any:
        p = destructive if name == "tools.destructive" else exfiltration
        return {"yes": p, "no": 1 - p}

    return script


@pytest.mark.parametrize(
    ("destructive", "exfiltration", "verdict", "rule"),
    [
        (0.05, 0.1, "allow", "exfiltration"),
        (0.5, 0.1, "review", "destructive"),
        (0.95, 0.5, "deny", "destructive"),
        (0.5, 0.9, "deny", "exfiltration"),
    ],
)
async def test_policy_check_verdicts(destructive: float, exfiltration: float, verdict: str, rule: str) -> None:
    router, engine = _router(_rules(destructive, exfiltration))
    result = await router.check("tools", ToolCall(id="c1", name="rm", args={"path": "/data"}))
    assert (result.verdict, result.rule, result.system2) == (verdict, rule, False)
    assert engine.calls[0][0] == "rm: /data"  # a tool call reaches System 1 as one compact line
    assert result.policy_version == "sha256:test"


async def test_checks_fail_closed_when_system_1_is_down() -> None:
    router, _ = _router(lambda *a: EngineHTTPError(500, "boom"))
    result = await router.check("tools", "drop table users")
    assert result.verdict == "deny"
    assert all(d.reason == "engine_error" for d in result.decisions.values())


async def test_checks_that_escalate_use_system_2_and_fail_closed_without_it() -> None:
    base = three_task_policy()
    tools = base.tasks["tools"]
    assert isinstance(tools, CheckTask)
    from dataclasses import replace

    policy = PolicySet(tasks={**base.tasks, "tools": replace(tools, on_failure="escalate")}, version="v2")
    chat = ScriptedChat(replies=[_answer_with("no"), _answer_with("no")])
    router, _ = _router(lambda *a: EngineHTTPError(502, "bad gateway"), chat, policy)
    result = await router.check("tools", "list files")
    assert (result.verdict, result.system2) == ("allow", True)
    router, _ = _router(lambda *a: EngineHTTPError(502, "bad gateway"), None, policy)
    result = await router.check("tools", "list files")
    assert result.verdict == "deny"
    assert "no frontier model configured" in result.decisions["destructive"].detail


async def test_classify_escalates_only_the_unsure_questions() -> None:
    def script(state: State, name: str, question: Question) -> Any:
        return {"yes": 0.95, "no": 0.05} if name == "triage.urgent" else {"0": 0.4, "1": 0.3, "2": 0.3}

    chat = ScriptedChat(replies=[_answer_with("2")])
    router, _ = _router(script, chat)
    decided = await router.classify("triage", "THIS IS THE THIRD TIME")
    assert (decided["urgent"].outcome, decided["urgent"].system) == ("yes", 1)
    assert (decided["tone"].outcome, decided["tone"].system) == ("2", 2)
    assert len(chat.calls) == 1


async def test_every_decision_is_recorded_with_its_state() -> None:
    seen: list[tuple[Decision, State]] = []

    class Sink:
        async def record(self, decision: Decision, *, state: State) -> None:
            seen.append((decision, state))

    router, _ = _router(_rules(0.1, 0.1), sink=Sink())
    await router.check("tools", "ls")
    assert [d.question for d, _ in seen] == ["destructive", "exfiltration"]
    assert all(state == "ls" for _, state in seen)


async def test_unknown_task_or_wrong_kind_is_a_config_error() -> None:
    router, _ = _router(_rules(0.1, 0.1))
    with pytest.raises(ConfigError, match="no task 'nope'"):
        await router.route("nope", [HumanMessage("x")])
    with pytest.raises(ConfigError, match="is a check task"):
        await router.route("tools", [HumanMessage("x")])


async def test_only_tasks_that_opt_in_mark_their_system_2_call_for_the_thought_sink() -> None:
    from fastslow.router.engine_api import THOUGHT_TASK

    seen: list[str | None] = []

    def respond(messages: Any, schema: Any) -> ChatResult:
        seen.append(THOUGHT_TASK.get())
        return _answer_with("billing")

    unsure = _route({"billing": 0.4, "technical": 0.35, "other": 0.25})
    router, _ = _router(unsure, ScriptedChat(respond=respond))
    await router.route("support", [HumanMessage("hmm")])
    router, _ = _router(unsure, ScriptedChat(respond=respond), three_task_policy(debug_thoughts=True))
    await router.route("support", [HumanMessage("hmm")])
    assert seen == [None, "support"]
    assert THOUGHT_TASK.get() is None


async def test_a_sink_that_batches_gets_a_checks_rules_in_one_call() -> None:
    batches: list[list[str]] = []

    class BatchingSink:
        async def record(self, decision: Decision, *, state: State) -> None:
            batches.append([decision.question])

        async def record_many(self, decisions: list[Decision], *, state: State) -> None:
            batches.append([d.question for d in decisions])

    router, _ = _router(_rules(0.1, 0.1), sink=BatchingSink())
    await router.check("tools", "ls")
    await router.route("support", [HumanMessage("I was charged twice")])
    assert batches == [["destructive", "exfiltration"], ["support"]]


@pytest.mark.parametrize("on_oversize", ["review", "deny"])
async def test_a_check_on_more_than_the_engine_reads_gets_on_oversize(on_oversize: str) -> None:
    from dataclasses import replace

    from fastslow.router.engine_api import EngineLimits

    base = three_task_policy()
    tools = base.tasks["tools"]
    assert isinstance(tools, CheckTask)
    policy = PolicySet(tasks={**base.tasks, "tools": replace(tools, on_oversize=on_oversize)}, version="v2")
    engine = ScriptedEngine(_rules(0.05, 0.1), limits=EngineLimits(max_read_chars=1_000))
    router = Router(lambda: policy, OneEngine(engine), Chats(None))
    # Within what the engine reads (padding does not count), System 1's allow stands.
    assert (await router.check("tools", "word " * 150 + " " * 10_000)).verdict == "allow"
    result = await router.check("tools", "word " * 300)
    assert result.verdict == on_oversize
    assert {d.reason for d in result.decisions.values()} == {"oversize"}
    assert "1499 characters" in next(iter(result.decisions.values())).detail
    # A rule that denies from what it read still denies.
    engine.script = _rules(0.95, 0.1)
    assert (await router.check("tools", "word " * 300)).verdict == "deny"
