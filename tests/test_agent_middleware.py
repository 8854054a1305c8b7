"""``PolicyGateMiddleware`` in real ``create_agent`` agents: allow, deny, and review with approve / reject / edit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from fastslow.graphs.middleware import GATE_KEY, PolicyGateMiddleware
from fastslow.policies import PolicyStore
from fastslow.router import Router

from fakes.chat_models import Recorded, ScriptedChatModel, call, counted_router
from fakes.scripted import Chats, OneEngine, ScriptedEngine

executed: list[str] = []


@tool
def shell(command: str) -> str:
    """Run a shell command."""
    executed.append(command)
    return f"ran {command}"


@pytest.fixture(autouse=True)
def _clear_executed() -> None:
    executed.clear()


RULES = 2
"""The ``tools`` check task of ``three_task_policy`` has two rules: one recorded decision each per check."""

Mode = Literal["sync", "async"]
MODES: list[Mode] = ["sync", "async"]


async def _run(agent: Any, payload: Any, config: Any, mode: Mode) -> Any:
    """``invoke`` (on a worker thread, where no event loop runs, as in sync code) or ``ainvoke``."""
    if mode == "sync":
        return await asyncio.to_thread(agent.invoke, payload, config)
    return await agent.ainvoke(payload, config)


def _asked_once(sink: Recorded, calls: int) -> None:
    """Every proposed call was checked once: one recorded decision per call and rule, none twice."""
    asked = sink.per_question()
    assert len(asked) == calls * RULES and set(asked.values()) == {1}, asked


def _agent(router: Router, model: ScriptedChatModel, checkpointer: Any = None) -> Any:
    return create_agent(
        model, tools=[shell], middleware=[PolicyGateMiddleware(router, "tools")], checkpointer=checkpointer
    )


def _model(*replies: AIMessage) -> ScriptedChatModel:
    return ScriptedChatModel(label="m", script=list(replies))


def _proposes(*calls: dict[str, Any]) -> AIMessage:
    return AIMessage("", tool_calls=list(calls))


def _tool_messages(messages: list[AnyMessage]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def _no_orphans(messages: list[AnyMessage]) -> None:
    asked = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    assert asked == set(_tool_messages(messages))


@pytest.mark.parametrize("mode", MODES)
async def test_an_allowed_call_runs(mode: Mode) -> None:
    router, engine, sink = counted_router()
    model = _model(_proposes(call("shell", "a", command="ls")), AIMessage("listed"))
    out = await _run(_agent(router, model), {"messages": [HumanMessage("show the files")]}, None, mode)
    assert executed == ["ls"]
    assert out[GATE_KEY] == [
        {"tool_call_id": "a", "name": "shell", "verdict": "allow", "rule": "destructive", "by": "System 1"}
    ]
    assert len(engine.calls) == 1
    _asked_once(sink, 1)
    assert out["messages"][-1].content == "listed"
    _no_orphans(out["messages"])


@pytest.mark.parametrize("mode", MODES)
async def test_a_denied_call_becomes_an_error_tool_message_and_the_model_carries_on(mode: Mode) -> None:
    router, _, sink = counted_router()
    model = _model(
        _proposes(call("shell", "x", command="rm -rf /data"), call("shell", "a", command="ls")),
        AIMessage("I listed them instead"),
    )
    out = await _run(_agent(router, model), {"messages": [HumanMessage("clean up")]}, None, mode)
    assert executed == ["ls"]
    refusal = _tool_messages(out["messages"])["x"]
    assert refusal.status == "error"
    assert "Refused by policy 'tools' (rule 'destructive', p=0.97, decided by System 1)" in refusal.text
    # The model's next call saw why, and it answered the user.
    second = model.log.calls[1]["messages"]
    assert any(isinstance(m, ToolMessage) and m.tool_call_id == "x" and m.status == "error" for m in second)
    assert out["messages"][-1].content == "I listed them instead"
    assert [g["verdict"] for g in out[GATE_KEY]] == ["deny", "allow"]
    _asked_once(sink, 2)
    _no_orphans(out["messages"])


REVIEWED = call("shell", "r", command="truncate log")
EDITS = {
    "approve": ({"type": "approve"}, ["ls", "truncate log"], "allow", "a person"),
    "reject": ({"type": "reject", "message": "not today"}, ["ls"], "deny", "a person"),
    "edit allowed": (
        {"type": "edit", "edited_action": {"name": "shell", "args": {"command": "ls -l log"}}},
        ["ls", "ls -l log"],
        "allow",
        "System 1",
    ),
    "edit denied": (
        {"type": "edit", "edited_action": {"name": "shell", "args": {"command": "rm -rf log"}}},
        ["ls"],
        "deny",
        "System 1",
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(EDITS))
async def test_review_pauses_like_human_in_the_loop_and_resumes_with_each_decision(case: str, mode: Mode) -> None:
    decision, ran, verdict, by = EDITS[case]
    router, engine, sink = counted_router()
    model = _model(_proposes(REVIEWED, call("shell", "a", command="ls")), AIMessage("finished"))
    agent = _agent(router, model, InMemorySaver())
    config = {"configurable": {"thread_id": case}}

    paused = await _run(agent, {"messages": [HumanMessage("make some room")]}, config, mode)
    request = paused["__interrupt__"][0].value
    assert [a["name"] for a in request["action_requests"]] == ["shell"]
    assert request["action_requests"][0]["args"] == {"command": "truncate log"}
    assert request["review_configs"] == [{"action_name": "shell", "allowed_decisions": ["approve", "edit", "reject"]}]
    fastslow = request["action_requests"][0]["fastslow"]
    assert (fastslow["task"], fastslow["rule"], fastslow["tool_call_id"]) == ("tools", "destructive", "r")
    assert fastslow["probability"] == pytest.approx(0.5)
    assert executed == []  # not even the allowed call runs before the review
    assert len(engine.calls) == 2
    _asked_once(sink, 2)

    out = await _run(agent, Command(resume={"decisions": [decision]}), config, mode)
    # The hook ran again from the top on resume; the two checks did not. An edit is a new call, checked once.
    checks = 3 if decision["type"] == "edit" else 2
    assert len(engine.calls) == checks
    _asked_once(sink, checks)
    assert sorted(executed) == ran
    record = next(g for g in out[GATE_KEY] if g["tool_call_id"] == "r")
    assert (record["verdict"], record["by"]) == (verdict, by)
    answer = _tool_messages(out["messages"])["r"]
    if case == "reject":
        assert answer.status == "error" and "not today" in answer.text
    elif case == "edit denied":
        assert answer.status == "error" and "Refused by policy 'tools' (rule 'destructive'" in answer.text
    elif case == "edit allowed":
        assert "a human reviewer replaced this tool call" in answer.text and "ran ls -l log" in answer.text
    assert out["messages"][-1].content == "finished"
    _no_orphans(out["messages"])


def test_an_edit_that_needs_review_again_pauses_again_under_invoke(tmp_path: Path) -> None:
    router, engine, sink = counted_router()
    model = _model(_proposes(REVIEWED), AIMessage("finished"))
    with SqliteSaver.from_conn_string(str(tmp_path / "agent.sqlite")) as saver:
        agent = _agent(router, model, saver)
        config = {"configurable": {"thread_id": "twice"}}
        agent.invoke({"messages": [HumanMessage("make some room")]}, config)
        assert len(engine.calls) == 1
        edit = {"type": "edit", "edited_action": {"name": "shell", "args": {"command": "truncate old log"}}}
        again = agent.invoke(Command(resume={"decisions": [edit]}), config)
        assert again["__interrupt__"][0].value["action_requests"][0]["args"] == {"command": "truncate old log"}
        assert len(engine.calls) == 2  # the edited call was checked again
        out = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    # Two resumes, each running the hook from the top: still one check per proposed call.
    assert len(engine.calls) == 2
    _asked_once(sink, 2)
    assert executed == ["truncate old log"]
    assert out[GATE_KEY][0]["by"] == "a person" and out["messages"][-1].content == "finished"


def test_a_wrong_number_of_decisions_is_refused() -> None:
    router, _, _ = counted_router()
    agent = _agent(router, _model(_proposes(REVIEWED)), InMemorySaver())
    config = {"configurable": {"thread_id": "count"}}
    agent.invoke({"messages": [HumanMessage("make some room")]}, config)
    with pytest.raises(ValueError, match="does not match"):
        agent.invoke(Command(resume={"decisions": []}), config)
    assert executed == []


POLICY = """\
version: 1
tasks:
  tools:
    kind: check
    on_failure: fail_closed
    rules:
      destructive:
        instructions: Does it delete data?
        deny_at: {deny_at}
        allow_at: 0.3
"""


async def test_the_gate_applies_a_hot_reloaded_policy_file_on_the_next_turn(tmp_path: Path) -> None:
    # The same PolicyStore as everywhere else (build_runtime's): one YAML file, reloaded when it changes.
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(deny_at=0.8))
    store = PolicyStore(path)
    engine = ScriptedEngine(lambda state, name, q: {"yes": 0.6, "no": 0.4} if name.startswith("tools.") else None)
    router = Router(lambda: store.current, OneEngine(engine), Chats(None))
    script = (_proposes(call("shell", "1", command="ls")), AIMessage("ok"), _proposes(call("shell", "2", command="ls")))
    agent = _agent(router, _model(*script), InMemorySaver())
    config = {"configurable": {"thread_id": "reload"}}
    first = await agent.ainvoke({"messages": [HumanMessage("list")]}, config)
    assert "__interrupt__" in first  # p=0.6 sits between allow_at 0.3 and deny_at 0.8
    await agent.ainvoke(Command(resume={"decisions": [{"type": "reject"}]}), config)

    path.write_text(POLICY.format(deny_at=0.5))
    assert store.check().changed
    second = await agent.ainvoke({"messages": [HumanMessage("list again")]}, config)
    assert "__interrupt__" not in second
    assert executed == [] and second[GATE_KEY][0]["verdict"] == "deny"
