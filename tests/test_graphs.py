"""The three ready graphs, end to end: System 1 scripted, System 2 scripted or a real SDK on loopback."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from pydantic import SecretStr

from fastslow.engines.chat import Frontier
from fastslow.graphs import (
    GRAPHS,
    NO_FRONTIER,
    TICKET_SCHEMA,
    GraphContext,
    draft_graph,
    run_graph,
    schema_errors,
    support_graph,
    tool_agent_graph,
)
from fastslow.graphs._tools import MAX_TOOL_ROUNDS
from fastslow.router import (
    CheckAction,
    CheckTask,
    ConfigError,
    EngineHTTPError,
    Noul,
    OpenEnded,
    PolicySet,
    Question,
    Route,
    Router,
    RouteTask,
    Rule,
    State,
    Thresholds,
    ToolCall,
)
from fastslow.router.engine_api import ChatResult
from fastslow.router.settings import ModelPrice, System2Settings

from fakes.openai_server import openai_server, structured, text, tool_calls
from fakes.scripted import Chats, OneEngine, ScriptedChat, ScriptedEngine


def _policy(routes: tuple[str, ...] = ("billing", "technical", "account", "other")) -> PolicySet:
    support = RouteTask(
        name="support",
        routes={name: Route(name=name, description=f"{name} questions") for name in routes},
        none_option="other",
        open_ended=OpenEnded(),
        thresholds=Thresholds(min_confidence=0.7, min_margin=0.1),
    )
    tool_safety = CheckTask(
        name="tool_safety",
        rules={
            "destructive": Rule(
                name="destructive",
                question=Noul(instructions="Does the call delete or overwrite data?"),
                action=CheckAction(deny_at=0.8, allow_at=0.3),
            )
        },
        on_failure="fail_closed",
    )
    return PolicySet(tasks={"support": support, "tool_safety": tool_safety}, version="sha256:graphs")


_KEYWORDS = {"refund": "billing", "crash": "technical", "password": "account"}


def _system1(state: State, name: str, question: Question) -> Any:
    """A keyword System 1: sure about obvious requests, unsure about the rest."""
    seen = json.dumps(state).lower()
    if name == "support.open_ended":
        return {"yes": 0.9, "no": 0.1} if "poem" in seen else {"yes": 0.05, "no": 0.95}
    if name == "support":
        route = next((r for word, r in _KEYWORDS.items() if word in seen), None)
        return (
            {o: (0.94 if o == route else 0.02) for o in question.options}
            if route
            else dict.fromkeys(question.options, 0.25)
        )
    if name == "tool_safety.destructive":
        p = 0.97 if "delete_file:" in seen else 0.02  # the router renders a call as "name: args"
        return {"yes": p, "no": 1 - p}
    raise AssertionError(f"unexpected question {name}")


def _router(policy: PolicySet | None = None) -> Router:
    the_policy = policy or _policy()
    return Router(lambda: the_policy, OneEngine(ScriptedEngine(_system1)), Chats(None))


@dataclass
class ByRef:
    """A ChatSource giving a different engine per model reference (``None`` is the default)."""

    chats: dict[str | None, Any] = field(default_factory=dict)

    def chat_for(self, ref: str | None) -> Any:
        return self.chats.get(ref)


def _reply(content: str = "", *, structured_value: Any = None, calls: tuple[ToolCall, ...] = ()) -> ChatResult:
    return ChatResult(content=content, model="frontier-1", structured=structured_value, tool_calls=calls)


def _ai(messages: list[AnyMessage]) -> AIMessage:
    message = messages[-1]
    assert isinstance(message, AIMessage)
    return message


def _no_orphans(messages: list[AnyMessage]) -> None:
    asked = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    assert asked == answered


# --- support triage ------------------------------------------------------------------------


async def _support(text_in: str, chats: Any, policy: PolicySet | None = None) -> dict[str, Any]:
    app = support_graph(_router(policy)).compile()
    return await app.ainvoke({"messages": [HumanMessage(text_in)]}, context=GraphContext(chats=chats))


@pytest.mark.parametrize(
    ("request_text", "node", "prompt_word"),
    [
        ("I want a refund for the double charge", "billing", "billing specialist"),
        ("the app crashes on start", "technical", "technical support"),
        ("I forgot my password", "account", "account specialist"),
    ],
)
async def test_support_routes_to_a_specialist_that_answers_with_its_own_prompt(
    request_text: str, node: str, prompt_word: str
) -> None:
    chat = ScriptedChat(replies=[_reply(f"{node} answer")])
    out = await _support(request_text, Chats(chat))
    assert (out["route"], out["outcome"]) == (node, "answered")
    assert out["decision"]["system"] == 1
    reply = _ai(out["messages"])
    assert (reply.content, reply.name) == (f"{node} answer", node)
    system_prompt, *history = chat.calls[0]["messages"]
    assert prompt_word in system_prompt.content and history[-1].content == request_text
    assert out["steps"] == [{"node": node, "model": "frontier-1", "status": "done", "detail": "", "cost_usd": None}]


async def test_open_ended_requests_go_to_the_frontier_agent() -> None:
    chat = ScriptedChat(replies=[_reply("Roses are red, invoices are due.")])
    out = await _support("write me a poem about invoices", Chats(chat))
    assert out["route"] is None and out["decision"]["reason"] == "open_ended"
    assert _ai(out["messages"]).name == "frontier" and out["outcome"] == "answered"


async def test_offline_support_ends_in_a_clear_escalation_outcome() -> None:
    out = await _support("hello there", Chats(None))
    assert out["outcome"] == "needs_system2"
    assert NO_FRONTIER in _ai(out["messages"]).content
    assert NO_FRONTIER in out["decision"]["detail"]  # the router could not ask System 2 either
    assert out["steps"][0]["status"] == "skipped"


async def test_an_engine_error_is_an_outcome_not_a_crash() -> None:
    chat = ScriptedChat(replies=[EngineHTTPError(503, "overloaded", engine="scripted-chat")])
    out = await _support("refund please", Chats(chat))
    assert out["outcome"] == "engine_error"
    assert "overloaded" in _ai(out["messages"]).content


async def test_support_over_the_real_sdk_keeps_only_final_content() -> None:
    reply = text("<think>they want money back</think>Your refund is on its way.", reasoning="hidden")
    with openai_server(reply) as (base_url, server):
        frontier = Frontier(System2Settings(openai_base_url=base_url, openai_api_key=SecretStr("sk-t"), max_retries=0))
        out = await _support("refund my order", frontier)
        await frontier.aclose()
    assert _ai(out["messages"]).content == "Your refund is on its way."
    sent = server.requests[0]["messages"]
    assert sent[0]["role"] == "system" and "billing" in sent[0]["content"]
    assert sent[-1] == {"role": "user", "content": "refund my order"}


def test_support_graph_refuses_a_policy_with_routes_no_agent_handles() -> None:
    with pytest.raises(ConfigError, match="sales"):
        support_graph(_router(_policy(routes=("billing", "sales", "other"))))


# --- the tool agent behind the policy gate ------------------------------------------------


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "sandbox"
    root.mkdir()
    (root / "a.txt").write_text("hello from a")
    (tmp_path / "secret.txt").write_text("do not read")
    return root


async def _tools(text_in: str, chats: Any, sandbox: Path | None) -> dict[str, Any]:
    app = tool_agent_graph(_router()).compile()
    return await app.ainvoke({"messages": [HumanMessage(text_in)]}, context=GraphContext(chats=chats, sandbox=sandbox))


async def test_a_denied_call_gets_a_refusal_and_the_file_survives(sandbox: Path) -> None:
    script = [tool_calls(("delete_file", {"path": "a.txt"})), text("Policy refused deleting a.txt.")]
    with openai_server(*script) as (base_url, server):
        frontier = Frontier(System2Settings(openai_base_url=base_url, max_retries=0))
        out = await _tools("delete a.txt", frontier, sandbox)
        await frontier.aclose()
    assert (sandbox / "a.txt").exists()
    refusal = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert refusal.status == "error" and "Refused by policy 'tool_safety'" in refusal.content
    _no_orphans(out["messages"])
    assert out["gate"] == [{"tool_call_id": "call_1_0", "verdict": "deny", "rule": "destructive", "by": "System 1"}]
    assert out["outcome"] == "answered" and _ai(out["messages"]).content == "Policy refused deleting a.txt."
    second = server.requests[1]["messages"]
    assert second[-1]["role"] == "tool" and "Refused by policy" in second[-1]["content"]


async def test_an_allowed_call_runs_the_tool_and_its_result_goes_back_to_the_model(sandbox: Path) -> None:
    script = [tool_calls(("read_file", {"path": "a.txt"})), text("It says hello.")]
    with openai_server(*script) as (base_url, server):
        frontier = Frontier(System2Settings(openai_base_url=base_url, max_retries=0))
        out = await _tools("what's in a.txt?", frontier, sandbox)
        await frontier.aclose()
    result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert result.content == "hello from a" and result.status == "success"
    assert server.requests[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_1_0", "content": "hello from a"}
    offered = [t["function"]["name"] for t in server.requests[0]["tools"]]
    assert offered == ["list_files", "read_file", "delete_file"]
    assert "runtime" not in json.dumps(server.requests[0]["tools"])  # injected, never shown to the model
    assert out["outcome"] == "answered"


async def test_one_turn_with_an_allowed_and_a_denied_call(sandbox: Path) -> None:
    calls = (
        ToolCall(id="l", name="list_files", args={}),
        ToolCall(id="d", name="delete_file", args={"path": "a.txt"}),
    )
    chat = ScriptedChat(replies=[_reply(calls=calls), _reply("Listed; deletion refused.")])
    out = await _tools("list then delete a.txt", Chats(chat), sandbox)
    results = {m.tool_call_id: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert results["l"].content == "a.txt" and results["d"].status == "error"
    assert (sandbox / "a.txt").exists()
    _no_orphans(out["messages"])


async def test_tools_cannot_leave_the_sandbox(sandbox: Path) -> None:
    calls = (ToolCall(id="r", name="read_file", args={"path": "../secret.txt"}),)
    chat = ScriptedChat(replies=[_reply(calls=calls), _reply("I can't read outside the sandbox.")])
    out = await _tools("read ../secret.txt", Chats(chat), sandbox)
    result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert result.status == "error" and "not a file inside the sandbox" in result.content
    assert "do not read" not in json.dumps([m.content for m in out["messages"]])


async def test_the_tool_loop_stops_after_its_round_limit(sandbox: Path) -> None:
    chat = ScriptedChat()

    def respond(messages: Any, schema: Any) -> ChatResult:
        offered = chat.calls[-1]["tools"]
        n = len(chat.calls)
        return _reply(calls=(ToolCall(id=f"c{n}", name="list_files", args={}),)) if offered else _reply("Enough.")

    chat.respond = respond
    out = await _tools("keep listing", Chats(chat), sandbox)
    assert len(chat.calls) == MAX_TOOL_ROUNDS and chat.calls[-1]["tools"] == []
    assert out["outcome"] == "step_limit" and _ai(out["messages"]).content == "Enough."
    _no_orphans(out["messages"])


async def test_offline_tool_agent_ends_in_a_clear_escalation_outcome(sandbox: Path) -> None:
    out = await _tools("delete a.txt", Frontier(System2Settings()), sandbox)
    assert out["outcome"] == "needs_system2" and NO_FRONTIER in _ai(out["messages"]).content
    assert (sandbox / "a.txt").exists()


# --- draft -> validate -> escalate ----------------------------------------------------------

GOOD = {"category": "billing", "priority": 2, "summary": "Double charge on the May invoice"}
BAD = {"category": "billing", "priority": 9, "summary": "Double charge", "mood": "angry"}


async def _draft(chats: Any, *, draft_model: str | None = "local:qwen") -> dict[str, Any]:
    app = draft_graph().compile()
    context = GraphContext(chats=chats, draft_model=draft_model)
    return await app.ainvoke({"messages": [HumanMessage("I was charged twice in May")]}, context=context)


async def test_a_valid_draft_is_kept_and_the_frontier_is_never_asked() -> None:
    worker = ScriptedChat(replies=[_reply(json.dumps(GOOD), structured_value=GOOD)], model="qwen")
    frontier = ScriptedChat()
    out = await _draft(ByRef({"local:qwen": worker, None: frontier}))
    assert (out["answer"], out["produced_by"], out["model"], out["outcome"]) == (
        GOOD,
        "draft",
        "frontier-1",
        "answered",
    )
    assert frontier.calls == [] and worker.calls[0]["schema"] == TICKET_SCHEMA
    assert json.loads(_ai(out["messages"]).content) == GOOD


async def test_an_invalid_draft_is_escalated_with_its_problems() -> None:
    worker = ScriptedChat(replies=[_reply(json.dumps(BAD), structured_value=BAD)])
    frontier = ScriptedChat(replies=[_reply(json.dumps(GOOD), structured_value=GOOD)])
    out = await _draft(ByRef({"local:qwen": worker, None: frontier}))
    assert (out["answer"], out["produced_by"], out["outcome"]) == (GOOD, "frontier", "answered")
    assert out["draft"] == BAD and len(out["validation_errors"]) == 2
    told = frontier.calls[0]["messages"][-1].content
    assert "priority" in told and "mood" in told


async def test_draft_and_escalation_over_two_loopback_servers() -> None:
    with openai_server(structured(BAD)) as (local_url, local), openai_server(structured(GOOD)) as (cloud_url, cloud):
        settings = System2Settings(
            local_base_url=local_url,
            openai_base_url=cloud_url,
            openai_api_key=SecretStr("sk-t"),
            max_retries=0,
            prices={"openai:gpt-5.5": ModelPrice(input=1.0, output=2.0)},
        )
        frontier = Frontier(settings)
        out = await _draft(frontier)
        await frontier.aclose()
    assert (out["produced_by"], out["answer"]) == ("frontier", GOOD)
    # Each step records its cost: the draft model is unpriced, the frontier call is 11 in, 7 out.
    assert [s["cost_usd"] for s in out["steps"]] == [None, pytest.approx((11 * 1.0 + 7 * 2.0) / 1e6)]
    assert local.requests[0]["model"] == "qwen" and cloud.requests[0]["model"] == "gpt-5.5"
    assert cloud.requests[0]["response_format"]["json_schema"]["strict"] is True


async def test_a_valid_draft_needs_no_frontier_configured() -> None:
    with openai_server(structured(GOOD)) as (local_url, _):
        out = await _draft(Frontier(System2Settings(local_base_url=local_url, max_retries=0)))
    assert (out["produced_by"], out["outcome"]) == ("draft", "answered")


async def test_offline_draft_graph_ends_in_a_clear_escalation_outcome() -> None:
    out = await _draft(Frontier(System2Settings()), draft_model=None)
    assert (out["answer"], out["produced_by"], out["outcome"]) == (None, None, "needs_system2")
    assert NO_FRONTIER in _ai(out["messages"]).content
    assert [s["node"] for s in out["steps"]] == ["draft", "frontier"]


async def test_a_frontier_answer_that_fails_validation_is_not_accepted() -> None:
    worker = ScriptedChat(replies=[EngineHTTPError(500, "down")])
    frontier = ScriptedChat(replies=[_reply(json.dumps(BAD), structured_value=BAD)])
    out = await _draft(ByRef({"local:qwen": worker, None: frontier}))
    assert (out["answer"], out["outcome"]) == (None, "invalid_answer")


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (GOOD, None),
        ({**GOOD, "priority": True}, "expected integer"),
        ({**GOOD, "priority": 2.0}, None),
        ({**GOOD, "category": "sales"}, "not one of"),
        ({"category": "billing", "priority": 1}, "missing required 'summary'"),
        ([GOOD], "expected object"),
    ],
)
def test_schema_errors(value: Any, problem: str | None) -> None:
    errors = schema_errors(value, TICKET_SCHEMA)
    assert (problem is None and errors == []) or (problem is not None and problem in "; ".join(errors))


# --- the registry and run_graph ---------------------------------------------------------------


def test_every_registered_graph_builds_against_a_policy_with_its_tasks() -> None:
    router = _router()
    for name, spec in GRAPHS.items():
        assert spec.name == name and spec.description
        for task, kind in spec.tasks.items():
            assert router.policy.tasks[task].kind == kind
        spec.factory(router).compile()


@pytest.mark.parametrize("name", list(GRAPHS))
async def test_run_graph_offline_returns_json_able_state(name: Any, sandbox: Path) -> None:
    out = await run_graph(name, "refund please", router=_router(), chats=Frontier(System2Settings()), sandbox=sandbox)
    assert json.loads(json.dumps(out)) == out
    assert out["graph"] == name and out["outcome"] == "needs_system2"
    assert out["messages"][0] == {"type": "human", "content": "refund please"}
    assert NO_FRONTIER in out["messages"][-1]["content"]


async def test_run_graph_names_a_missing_policy_task() -> None:
    router = Router(lambda: PolicySet(tasks={}, version="v"), OneEngine(ScriptedEngine(_system1)), Chats(None))
    with pytest.raises(ConfigError, match="tool_safety"):
        await run_graph("guarded-tools", "hi", router=router, chats=Chats(None))
