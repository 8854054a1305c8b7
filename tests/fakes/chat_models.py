"""A scripted LangChain chat model for ``create_agent`` tests (replays AIMessages, records who answered)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from pydantic import Field

from fastslow.router import Decision, PolicySet, Question, Router, State

from fakes.policies import three_task_policy
from fakes.scripted import Chats, OneEngine, ScriptedEngine

__all__ = ["Answered", "Recorded", "ScriptedChatModel", "call", "counted_router", "keyword_script"]


class Answered:
    """A log shared by several models: which model answered each call, with what it was sent."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    @property
    def models(self) -> list[str]:
        return [c["model"] for c in self.calls]


class ScriptedChatModel(BaseChatModel):
    """Replies with the next scripted ``AIMessage`` (or ``respond(messages)``); "done" once the script ends.

    ``bind_tools`` binds the tool names, so a test can see what a call offered. ``thinking`` mimics
    ``ChatAnthropic``'s field of that name.
    """

    label: str
    script: list[AIMessage] = Field(default_factory=list)
    respond: Callable[[list[BaseMessage]], AIMessage] | None = None
    log: Answered = Field(default_factory=Answered)
    thinking: dict[str, Any] | None = None

    model_config = {"arbitrary_types_allowed": True}

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        names = [t.name if isinstance(t, BaseTool) else t.get("name", str(t)) for t in tools]
        return self.bind(tool_names=names, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        del stop, run_manager
        self.log.calls.append(
            {
                "model": self.label,
                "messages": list(messages),
                "tools": kwargs.get("tool_names", []),
                "thinking": self.thinking,
            }
        )
        if self.respond is not None:
            reply = self.respond(messages)
        elif self.script:
            reply = self.script.pop(0)
        else:
            reply = AIMessage(f"done ({self.label})")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    """A tool call as a model proposes it."""
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


class Recorded:
    """A decision sink that keeps every decision it is given, with the state it was made about."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.states: list[State] = []

    async def record(self, decision: Decision, *, state: State) -> None:
        self.decisions.append(decision)
        self.states.append(state)

    def per_question(self) -> Counter[tuple[str, str]]:
        """How often each (item decided about, question) was recorded: 1 each when nothing was asked twice."""
        return Counter((str(_item(s)), d.question) for d, s in zip(self.decisions, self.states, strict=True))


def _item(state: State) -> Any:
    # The checked call, with or without the conversation the router may wrap it in.
    return state.get("item", state.get("message", state)) if isinstance(state, dict) else state


def keyword_script(state: State, name: str, question: Question) -> Any:
    """System 1 reading keywords of the routed turn or of the checked tool call (not its context)."""
    text = str(_item(state)).lower()
    if name == "support":
        if "charge" in text or "refund" in text:
            return {"billing": 0.9, "technical": 0.05, "other": 0.05}
        if "crash" in text:
            return {"billing": 0.05, "technical": 0.9, "other": 0.05}
        return {"billing": 0.34, "technical": 0.33, "other": 0.33}
    if name.startswith("tools."):
        if name == "tools.destructive":
            p = 0.97 if "rm -rf" in text else 0.5 if "truncate" in text else 0.02
        else:
            p = 0.02
        return {"yes": p, "no": 1 - p}
    return None


def counted_router(policy: PolicySet | None = None) -> tuple[Router, ScriptedEngine, Recorded]:
    """A router over ``three_task_policy`` (or ``policy``) with a counting engine and a recording sink."""
    fixed = policy or three_task_policy()
    engine, sink = ScriptedEngine(keyword_script), Recorded()
    return Router(lambda: fixed, OneEngine(engine), Chats(None), sink=sink), engine, sink
