"""The tool agent offline: with no chat model, an offline planner proposes calls, so the policy gate still judges.

System 1 (scripted here, the embedded engine in the last test) answers which demo tool a request
needs; the planner proposes it for each file the request names, or every file in the sandbox, and
says that no model wrote it. The gate judges each call as it would a model's, and the run ends with
what the gate decided and the usual "no frontier model configured" outcome.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from fastslow.api import build_runtime
from fastslow.graphs import DEMO_FILES, NO_FRONTIER, ToolAgentContext, run_graph, tool_agent_graph
from fastslow.graphs._tools import PLANNER_MIN_CONFIDENCE
from fastslow.router import (
    CheckAction,
    CheckTask,
    EngineHTTPError,
    Noul,
    PolicySet,
    Question,
    Router,
    Rule,
    Settings,
    State,
)

from fakes.scripted import Chats, OneEngine, ScriptedEngine

TOOLS = ("list_files", "read_file", "delete_file", "none")
PLANNER = "Offline planner (no chat model is configured; no model wrote this)"


def _policy() -> PolicySet:
    rule = Rule(
        name="destructive",
        question=Noul(instructions="Does the call delete or overwrite data?"),
        action=CheckAction(deny_at=0.8, allow_at=0.3),
    )
    check = CheckTask(name="tool_safety", rules={"destructive": rule}, on_failure="fail_closed")
    return PolicySet(tasks={"tool_safety": check}, version="sha256:offline")


def _system1(tool: dict[str, float] | Exception, *, destructive: float = 0.97) -> ScriptedEngine:
    """System 1 picking ``tool`` for the planner; for the gate, a deletion is ``destructive`` likely."""

    def script(state: State, name: str, question: Question) -> Any:
        if name == "tool":
            assert question.options == TOOLS
            return tool
        assert name == "tool_safety.destructive", name
        p = destructive if "delete_file:" in json.dumps(state) else 0.02
        return {"yes": p, "no": 1 - p}

    return ScriptedEngine(script)


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    root = tmp_path / "sandbox"
    root.mkdir()
    (root / "a.txt").write_text("hello from a")
    (root / "b.txt").write_text("hello from b")
    (tmp_path / "secret.txt").write_text("do not read")
    return root


async def _run(text: str, system1: ScriptedEngine, sandbox: Path) -> dict[str, Any]:
    router = Router(_policy, OneEngine(system1), Chats(None))
    app = tool_agent_graph(router).compile()
    context = ToolAgentContext(chats=Chats(None), sandbox=sandbox, system1=system1)
    return await app.ainvoke({"messages": [HumanMessage(text)]}, context=context)


def _planned(messages: list[AnyMessage]) -> AIMessage:
    (plan,) = [m for m in messages if isinstance(m, AIMessage) and m.tool_calls]
    return plan


def _calls(message: AIMessage) -> list[tuple[str, dict[str, Any]]]:
    return [(c["name"], c["args"]) for c in message.tool_calls]


async def test_every_file_is_proposed_and_the_gate_judges_each_call(sandbox: Path) -> None:
    system1 = _system1({"delete_file": 0.9, "list_files": 0.1})
    out = await _run("delete every file in the sandbox", system1, sandbox)
    plan = _planned(out["messages"])
    assert plan.name == "agent" and plan.content.startswith(PLANNER)
    assert "chose 'delete_file'" in plan.content and "each file in the sandbox" in plan.content
    assert _calls(plan) == [("delete_file", {"path": "a.txt"}), ("delete_file", {"path": "b.txt"})]
    # The gate judged both calls (here: denied), refused them with a ToolMessage each, and nothing was deleted.
    ids = [c["id"] for c in plan.tool_calls]
    assert out["gate"] == [{"tool_call_id": i, "verdict": "deny", "rule": "destructive", "by": "System 1"} for i in ids]
    refusals = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in refusals] == ids and {m.status for m in refusals} == {"error"}
    assert (sandbox / "a.txt").exists() and (sandbox / "b.txt").exists()
    # The run ends saying what the gate decided, and that no model can answer in words.
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert "- delete_file(path=a.txt): deny by System 1 (rule destructive)" in final.content
    assert NO_FRONTIER in final.content
    assert out["outcome"] == "needs_system2"
    assert [(s["node"], s["status"], s["model"]) for s in out["steps"]] == [
        ("agent", "done", None),
        ("agent", "skipped", None),
    ]
    assert system1.calls[0] == ("delete every file in the sandbox", ["tool"])


async def test_an_allowed_call_runs_and_its_result_is_reported(sandbox: Path) -> None:
    out = await _run("which files are there?", _system1({"list_files": 0.8, "read_file": 0.2}), sandbox)
    assert _calls(_planned(out["messages"])) == [("list_files", {})]
    assert [g["verdict"] for g in out["gate"]] == ["allow"]
    result = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert result.content == "a.txt\nb.txt" and result.status == "success"
    assert "- list_files(): allow by System 1 (rule destructive); the tool returned: a.txt b.txt" in (
        out["messages"][-1].content
    )


@pytest.mark.parametrize(
    ("request_text", "tool", "paths"),
    [
        ("please delete b.txt", "delete_file", ["b.txt"]),
        ("delete a.txt and data.txt", "delete_file", ["a.txt", "data.txt"]),  # data.txt is not there: as written
        ("read ../secret.txt", "read_file", ["../secret.txt"]),
    ],
)
async def test_only_the_files_a_request_names_are_proposed(
    sandbox: Path, request_text: str, tool: str, paths: list[str]
) -> None:
    out = await _run(request_text, _system1({tool: 0.9}), sandbox)
    assert _calls(_planned(out["messages"])) == [(tool, {"path": p}) for p in paths]
    assert (sandbox / "a.txt").exists()  # deletions denied
    # A path outside the sandbox passes the gate (nothing destructive) and the tool refuses it.
    assert "do not read" not in json.dumps([m.content for m in out["messages"]])


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        ({"none": 0.8, "read_file": 0.2}, "chose 'none' for this request (p=0.80): no file tool to call"),
        ({"read_file": 0.4, "delete_file": 0.35, "none": 0.25}, f"too unsure (below {PLANNER_MIN_CONFIDENCE})"),
        (EngineHTTPError(503, "overloaded", engine="scripted"), "System 1 could not say which tool"),
    ],
)
async def test_no_call_is_proposed_without_a_tool_system1_is_sure_of(
    sandbox: Path, tool: dict[str, float] | Exception, said: str
) -> None:
    out = await _run("write me a poem", _system1(tool), sandbox)
    assert not out.get("gate")  # the gate never ran
    (reply,) = [m for m in out["messages"] if isinstance(m, AIMessage)]
    assert not reply.tool_calls and reply.content.startswith(PLANNER)
    assert said in reply.content and NO_FRONTIER in reply.content
    assert out["outcome"] == "needs_system2"
    assert [(s["node"], s["status"]) for s in out["steps"]] == [("agent", "skipped")]


async def test_a_reviewed_call_waits_for_a_person_and_each_turn_has_its_own_calls(sandbox: Path) -> None:
    system1 = _system1({"delete_file": 0.9}, destructive=0.5)  # between allow_at and deny_at: review
    app = tool_agent_graph(Router(_policy, OneEngine(system1), Chats(None))).compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t"}}
    context = ToolAgentContext(chats=Chats(None), sandbox=sandbox, system1=system1)
    paused = await app.ainvoke({"messages": [HumanMessage("delete a.txt")]}, config, context=context)
    (asked,) = paused["__interrupt__"]
    assert asked.value["tool_call"]["args"] == {"path": "a.txt"} and (sandbox / "a.txt").exists()
    done = await app.ainvoke(Command(resume="allow"), config, context=context)
    assert not (sandbox / "a.txt").exists()
    assert "- delete_file(path=a.txt): allow by a person (rule destructive); the tool returned: deleted a.txt" in (
        done["messages"][-1].content
    )
    # A second turn: its calls have ids of their own, and its account speaks of them alone.
    again = await app.ainvoke({"messages": [HumanMessage("delete b.txt")]}, config, context=context)
    await app.ainvoke(Command(resume="deny"), config, context=context)
    final = (await app.aget_state(config)).values
    first, second = (m for m in final["messages"] if isinstance(m, AIMessage) and m.tool_calls)
    assert {c["id"] for c in first.tool_calls}.isdisjoint(c["id"] for c in second.tool_calls)
    assert again["__interrupt__"][0].value["tool_call"]["args"] == {"path": "b.txt"}
    summary = final["messages"][-1].content
    assert "delete_file(path=b.txt): deny by a person" in summary and "a.txt" not in summary
    assert (sandbox / "b.txt").exists()


async def test_run_graph_gives_the_planner_system1_and_a_demo_sandbox() -> None:
    system1 = _system1({"delete_file": 0.95})
    router = Router(_policy, OneEngine(system1), Chats(None))
    text = "delete every file in the sandbox"
    out = await run_graph("guarded-tools", text, router=router, chats=Chats(None), engines=OneEngine(system1))
    assert json.loads(json.dumps(out)) == out
    assert "temporary demo folder" in out["sandbox"]
    planned = next(m for m in out["messages"] if m.get("tool_calls"))
    assert [c["args"]["path"] for c in planned["tool_calls"]] == sorted(DEMO_FILES)
    assert [g["verdict"] for g in out["gate"]] == ["deny"] * len(DEMO_FILES)
    assert out["outcome"] == "needs_system2" and NO_FRONTIER in out["messages"][-1]["content"]


@pytest.mark.slow
async def test_offline_on_the_shipped_policy_the_gate_judges_the_planned_deletions(tmp_path: Path) -> None:
    # What `fastslow graph run guarded-tools --input "delete every file in the sandbox"` runs: the
    # embedded engine plans and judges. The verdicts are the shipped tool_safety rule's to choose
    # (allow, review or deny); a review pauses the run at that call, for a person.
    runtime = build_runtime(Settings(data_dir=tmp_path / "data"))
    try:
        out = await run_graph(
            "guarded-tools",
            "delete every file in the sandbox",
            router=runtime.router,
            chats=runtime.chats,
            engines=runtime.engines,
        )
    finally:
        await runtime.aclose()
    planned = next(m for m in out["messages"] if m.get("tool_calls"))
    assert planned["content"].startswith(PLANNER)
    assert [(c["name"], c["args"]) for c in planned["tool_calls"]] == [
        ("delete_file", {"path": name}) for name in sorted(DEMO_FILES)
    ]
    ids = [c["id"] for c in planned["tool_calls"]]
    judged = [g["tool_call_id"] for g in out["gate"]]
    reviewed = [i["value"]["tool_call"]["id"] for i in out.get("interrupts", [])]
    assert judged == ids or (reviewed and set(reviewed) <= set(ids)), out
