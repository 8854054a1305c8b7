"""Scripted System-1 and System-2 engines for router tests (langgraph's fake_chat, in spirit)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import BaseMessage

from fastslow.router import Answer, Image, NoAnswer, PolicySet, Question, ReadOptions, State
from fastslow.router.engine_api import ChatResult, EngineLimits, EngineReply, Signals, ToolSpec

Script = Callable[[State, str, Question], Mapping[str, float] | Exception | str | None]
"""Given (state, question name, question): a distribution, an exception to raise, or a NoAnswer reason."""


@dataclass
class ScriptedEngine:
    """A DecisionEngine whose answers come from a function; records every call."""

    script: Script
    name: str = "scripted"
    limits: EngineLimits = field(default_factory=EngineLimits)
    calls: list[tuple[State, list[str]]] = field(default_factory=list)
    signals: Signals = field(default_factory=Signals)

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        del images, options
        return self._answer(state, questions)

    def _answer(self, state: State, questions: Mapping[str, Question]) -> EngineReply:
        self.calls.append((state, list(questions)))
        answers: dict[str, Answer | NoAnswer] = {}
        for name, question in questions.items():
            out = self.script(state, name, question)
            if isinstance(out, Exception):
                raise out
            if out is None or isinstance(out, str):
                answers[name] = NoAnswer(
                    question=name, kind=question.kind, reason=out or "null answer", engine=self.name, model="m"
                )
                continue
            probs = {o: float(out.get(o, 0.0)) for o in question.options}
            total = sum(probs.values()) or 1.0
            answers[name] = Answer(
                question=name,
                kind=question.kind,
                probabilities={o: p / total for o, p in probs.items()},
                engine=self.name,
                model="scripted-1",
                signals=self.signals,
            )
        return EngineReply(answers=answers, engine=self.name, model="scripted-1", latency_ms=0.1)

    async def aclose(self) -> None:
        return None


@dataclass
class SyncScriptedEngine(ScriptedEngine):
    """A ``ScriptedEngine`` that also answers sync callers (``SyncDecisionEngine``), counting each way."""

    async_calls: int = 0
    sync_calls: int = 0

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        self.async_calls += 1
        return await super().decide(state, questions, images=images, options=options)

    def decide_sync(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply | None:
        del images, options
        self.sync_calls += 1
        return self._answer(state, questions)


@dataclass
class OneEngine:
    """An EngineSource that always gives the same engine."""

    engine: Any

    def engine_for(self, name: str | None, policy: PolicySet) -> Any:
        del name, policy
        return self.engine


@dataclass
class ScriptedChat:
    """A ChatEngine replying from a queue (or a function of the messages); records every call."""

    replies: list[ChatResult | Exception] = field(default_factory=list)
    respond: Callable[[Sequence[BaseMessage], Mapping[str, Any] | None], ChatResult] | None = None
    name: str = "scripted-chat"
    model: str = "frontier-1"
    base_url: str | None = "https://api.frontier.example/v1"
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: Any = None,
    ) -> ChatResult:
        self.calls.append(
            {
                "messages": list(messages),
                "tools": list(tools),
                "schema": schema,
                "timeout_s": timeout_s,
                "tool_runner": tool_runner,
            }
        )
        if self.respond is not None:
            return self.respond(messages, schema)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def aclose(self) -> None:
        return None


@dataclass
class Chats:
    """A ChatSource: one chat engine for every reference, or none at all."""

    chat: Any = None
    asked: list[str | None] = field(default_factory=list)

    def chat_for(self, ref: str | None) -> Any:
        self.asked.append(ref)
        return self.chat
