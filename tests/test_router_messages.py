"""The conversation ``Router.route`` and ``check`` take: every form LangChain takes, and no decision about nothing.

Dict messages, ``(role, text)`` pairs or a plain string once found no ``HumanMessage``, so the
router routed the empty string, confidently. Now each form is read as LangChain reads it, and a
conversation with nothing to route (empty, no user turn, an empty latest turn, not a conversation
at all) is an ``InvalidRequest`` naming the argument: no engine call, no decision recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.prompt_values import ChatPromptValue

from fastslow.router import CheckTask, Decision, InvalidRequest, PolicySet, Question, Router, State, ToolCall
from fastslow.router._turns import as_messages, split_turns

from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedEngine

CHARGED = "I was charged twice"
CALL = ToolCall(id="c1", name="shell", args={"cmd": "rm -rf /var/lib/postgresql/data"})


def _keyword(state: State, name: str, question: Question) -> Any:
    del question
    if name.endswith(".open_ended"):
        return {"yes": 0.05, "no": 0.95}
    if name.startswith("tools."):
        return {"yes": 0.1, "no": 0.9}
    text = str(state).lower()
    if "charged" in text:
        return {"billing": 0.9, "technical": 0.05, "other": 0.05}
    # What an engine makes of the empty string: confident, and wrong.
    return {"billing": 0.05, "technical": 0.9, "other": 0.05}


@dataclass
class ListSink:
    decisions: list[Decision] = field(default_factory=list)

    async def record(self, decision: Decision, *, state: State) -> None:
        del state
        self.decisions.append(decision)


def _router(policy: PolicySet | None = None) -> tuple[Router, ScriptedEngine, ListSink]:
    engine, sink, the_policy = ScriptedEngine(_keyword), ListSink(), policy or three_task_policy()
    return Router(lambda: the_policy, OneEngine(engine), Chats(None), sink=sink), engine, sink


FORMS = {
    "messages": [HumanMessage(CHARGED)],
    "role/content dicts": [{"role": "user", "content": CHARGED}],
    "type/content dicts": [{"type": "human", "content": CHARGED}],
    "(role, text) pairs": [("user", CHARGED)],
    "strings as items": [CHARGED],
    "a plain string": CHARGED,
    "a tuple of mixed forms": (
        SystemMessage("be brief"),
        ("assistant", "Hello!"),
        {"role": "user", "content": CHARGED},
    ),
    "a prompt value": ChatPromptValue(messages=[HumanMessage(CHARGED)]),
}


@pytest.mark.parametrize("form", FORMS.values(), ids=FORMS.keys())
async def test_every_form_langchain_takes_is_routed_on_its_latest_user_turn(form: Any) -> None:
    router, engine, _ = _router()
    decided = [await router.route("support", form), router.route_sync("support", form)]
    assert [(d.outcome, d.reason) for d in decided] == [("billing", "confident")] * 2
    assert [state for state, _ in engine.calls] == [CHARGED, CHARGED]


async def test_earlier_turns_in_dict_form_are_read_as_their_roles() -> None:
    policy = three_task_policy(system1_context=True, context_turns=2)
    router, engine, _ = _router(policy)
    history = [
        {"role": "user", "content": "My app crashes"},
        {"role": "assistant", "content": "Which version?"},
        {"role": "tool", "content": "ignored", "tool_call_id": "t1"},
        ("human", CHARGED),
    ]
    await router.route("support", history)
    assert engine.calls[0][0] == {"message": CHARGED, "earlier": ["user: My app crashes", "assistant: Which version?"]}


NOTHING_TO_ROUTE = {
    "an empty list": ([], "messages", "is empty"),
    "an empty string": ("", "messages", "is an empty string"),
    "no user turn": ([SystemMessage("be brief"), AIMessage("Hello!")], "messages", "has no user turn"),
    "no user turn, as dicts": ([{"role": "assistant", "content": "Hello!"}], "messages", "has no user turn"),
    "an empty latest user turn": (
        [HumanMessage(CHARGED), AIMessage("ok"), HumanMessage("  ")],
        "messages.2",
        "no text",
    ),
    "an image alone": (
        [HumanMessage(content=[{"type": "image", "url": "https://example.com/a.png"}])],
        "messages.0",
        "no text",
    ),
    "None": (None, "messages", "not NoneType"),
    "one message dict, not a list": ({"role": "user", "content": CHARGED}, "messages", "not dict"),
    "one message, not a list": (HumanMessage(CHARGED), "messages", "not HumanMessage"),
    "a dict without a role": ([{"content": CHARGED}], "messages.0", "must contain 'role'"),
    "an unknown role": ([("robot", CHARGED)], "messages.0", "'robot'"),
    "a number": ([HumanMessage("a"), 7], "messages.1", "Unsupported message type"),
}


@pytest.mark.parametrize(("messages", "where", "why"), NOTHING_TO_ROUTE.values(), ids=NOTHING_TO_ROUTE.keys())
async def test_a_conversation_with_nothing_to_route_is_an_error_never_a_decision(
    messages: Any, where: str, why: str
) -> None:
    router, engine, sink = _router()
    with pytest.raises(InvalidRequest, match=why) as raised:
        await router.route("support", messages)
    assert raised.value.field == where and isinstance(raised.value, ValueError)
    with pytest.raises(InvalidRequest, match=why):
        router.route_sync("support", messages)
    assert engine.calls == [] and sink.decisions == []


def test_a_list_of_messages_is_read_as_it_is_not_copied() -> None:
    # On every graph step: what add_messages keeps in state costs no conversion.
    messages = [HumanMessage("a"), AIMessage("b"), HumanMessage(CHARGED)]
    assert as_messages(messages, "messages") is messages
    assert split_turns(messages, 1) == (CHARGED, ("assistant: b",))
    assert as_messages([{"role": "user", "content": "a"}, ("ai", "b")], "context") == [
        HumanMessage("a"),
        AIMessage("b"),
    ]


def _check_policy() -> PolicySet:
    policy = three_task_policy()
    tools = policy.tasks["tools"]
    assert isinstance(tools, CheckTask)
    return replace(policy, tasks={**policy.tasks, "tools": replace(tools, system1_context=True)})


@pytest.mark.parametrize(
    "context",
    [
        [{"role": "user", "content": "free up disk space"}, {"role": "assistant", "content": "Looking."}],
        [("user", "free up disk space"), ("assistant", "Looking.")],
        (HumanMessage("free up disk space"), AIMessage("Looking.")),
    ],
    ids=["dicts", "pairs", "messages"],
)
async def test_a_checks_context_is_read_in_every_form(context: Any) -> None:
    router, engine, _ = _router(_check_policy())
    await router.check("tools", CALL, context=context)
    router.check_sync("tools", CALL, context=context)
    together = [state for state, _ in engine.calls if isinstance(state, dict)]
    assert [s["conversation"] for s in together] == [["free up disk space", "Looking."]] * 2


async def test_a_checks_context_as_a_string_is_one_user_turn_and_a_bad_one_is_refused() -> None:
    router, engine, _ = _router(_check_policy())
    await router.check("tools", CALL, context="free up disk space")
    assert [s["conversation"] for s, _ in engine.calls if isinstance(s, dict)] == [["free up disk space"]]
    for bad, where in (([{"content": "x"}], "context.0"), (7, "context")):
        with pytest.raises(InvalidRequest) as raised:
            await router.check("tools", CALL, context=bad)
        assert raised.value.field == where
    # No context at all is no error: the item alone is judged.
    assert (await router.check("tools", CALL)).verdict == "allow"
