"""Fallback chains: the first engine that answers, within the call's one deadline.

``FallbackEngine(primary, *fallbacks)`` asks its System-1 engines in order and returns the first
reply (its ``EngineReply.engine`` names the engine that answered); ``FallbackChatEngine`` does the
same for System-2 engines (``ChatResult.model`` names the model that answered). They compose with
``BreakerEngine``: an engine whose breaker is open fails at once with ``CircuitOpen``, so the chain
moves on without waiting. This is pydantic-ai's ``FallbackModel`` idea: small wrappers, no framework.

The chain moves on after an error that says the engine cannot serve (``counts_as_failure``), an
open breaker, or ``Overloaded`` (that engine's own queue is full: another engine may have room).
Anything else, ``InvalidRequest`` and a 4xx about the request above all, is raised at once: the
next engine would refuse it too. Every engine gets what is left of one budget, the call's
``ReadOptions.timeout_s`` (or ``timeout_s`` for chat) cut to the request's deadline; when it is
spent no further engine is asked. When every engine fails, the last meaningful error (not an open
breaker, when there is one) is raised, with a note naming what the others raised.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import BaseMessage

from ._answers import EngineReply
from ._breaker import CircuitOpen, counts_as_failure
from ._chat import ChatEngine, ChatResult, ToolCall, ToolOutcome, ToolRunner, ToolSpec
from ._engine import DecisionEngine, EngineLimits, ReadOptions, SyncDecide
from ._errors import EngineTimeout
from ._questions import Image, Question, State
from ._timing import Deadline
from ._tracing import Attr, Event, GenAI, add_event
from ._work import Overloaded, budget_s

__all__ = ["FallbackChatEngine", "FallbackEngine", "falls_back"]

_NO_OPTIONS = ReadOptions()


def falls_back(error: BaseException) -> bool:
    """Whether a chain moves on to its next engine after ``error`` (see the module docstring)."""
    return counts_as_failure(error) or isinstance(error, (CircuitOpen, Overloaded))


def _common_limits(limits: Sequence[EngineLimits]) -> EngineLimits:
    """What every engine of a chain accepts, so the router never sends what a fallback cannot take."""

    def smallest(values: Sequence[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return EngineLimits(
        max_questions=smallest([x.max_questions for x in limits]),
        min_options=max(x.min_options for x in limits),
        max_options=smallest([x.max_options for x in limits]),
        max_score_levels=smallest([x.max_score_levels for x in limits]),
        accepts_images=all(x.accepts_images for x in limits),
        max_read_chars=smallest([x.max_read_chars for x in limits]),
        max_read_tokens=smallest([x.max_read_tokens for x in limits]),
    )


class _Failures:
    """What the engines of one chained call raised, and the error to raise when none answered."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = names
        self.errors: list[tuple[str, BaseException]] = []

    def add(self, name: str, error: BaseException) -> None:
        if not falls_back(error):
            raise error
        self.errors.append((name, error))

    def final(self, deadline: Deadline | None) -> BaseException:
        if not self.errors:
            # Only when the budget was spent before the first engine was asked.
            budget = f"{deadline.budget_s:g} s " if deadline is not None else ""
            return EngineTimeout(f"the {budget}budget ran out before any engine was asked", engine=self.names[0])
        meaningful = [e for _, e in self.errors if not isinstance(e, CircuitOpen)]
        chosen = meaningful[-1] if meaningful else self.errors[-1][1]
        others = [f"{name}: {type(e).__name__}: {e}" for name, e in self.errors if e is not chosen]
        skipped = [n for n in self.names if n not in {name for name, _ in self.errors}]
        lines = [*others, *(f"{name}: not asked, the budget ran out" for name in skipped)]
        if lines:
            # A note rather than a new error: the type (a 401 against a timeout) decides what the
            # API answers, and notes reach the log's traceback, never the client's message.
            chosen.add_note("fallback chain, the other engines: " + "; ".join(lines))
        return chosen


def _chain_deadline(timeout_s: float | None) -> Deadline | None:
    """One deadline for the whole chain: the call's budget, cut to the request's (``budget_s``)."""
    budget = budget_s(timeout_s)
    return Deadline(budget) if budget is not None else None


def _remaining(deadline: Deadline | None) -> float | None:
    return None if deadline is None else deadline.remaining


class FallbackEngine:
    """The first of ``primary, *fallbacks`` to answer (see the module docstring).

    ``limits`` is what every engine in the chain accepts; ``examples_versions`` are the primary's.
    """

    def __init__(self, primary: DecisionEngine, *fallbacks: DecisionEngine) -> None:
        self.engines: tuple[DecisionEngine, ...] = (primary, *fallbacks)
        self.name = "fallback:" + ",".join(e.name for e in self.engines)
        self.limits = _common_limits([e.limits for e in self.engines])
        self.examples_versions: Mapping[str, str] = getattr(primary, "examples_versions", None) or {}

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """The first engine's reply that comes; raises when none answered within the budget."""
        deadline = _chain_deadline(options.timeout_s if options is not None else None)
        failures = _Failures([e.name for e in self.engines])
        for engine in self.engines:
            left = _remaining(deadline)
            if left is not None and left <= 0.0:
                break
            opts = options if left is None else replace(options or _NO_OPTIONS, timeout_s=left)
            try:
                return await engine.decide(state, questions, images=images, options=opts)
            except Exception as exc:  # sorted by ``falls_back``; the rest is raised
                failures.add(engine.name, exc)
                _fell_back(engine.name, exc)
        raise failures.final(deadline)

    def decide_sync(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply | None:
        """``decide`` from sync code; ``None`` as soon as an engine in the chain needs the event loop.

        The caller then awaits ``decide``, which starts the chain over: an engine that failed here
        is asked again unless its breaker has opened meanwhile.
        """
        deadline = _chain_deadline(options.timeout_s if options is not None else None)
        failures = _Failures([e.name for e in self.engines])
        for engine in self.engines:
            left = _remaining(deadline)
            if left is not None and left <= 0.0:
                break
            sync: SyncDecide | None = getattr(engine, "decide_sync", None)
            if sync is None:
                return None
            opts = options if left is None else replace(options or _NO_OPTIONS, timeout_s=left)
            try:
                reply = sync(state, questions, images=images, options=opts)
            except Exception as exc:  # sorted by ``falls_back``; the rest is raised
                failures.add(engine.name, exc)
                _fell_back(engine.name, exc)
                continue
            return reply
        raise failures.final(deadline)

    async def aclose(self) -> None:
        await _close_all(self.engines)


class FallbackChatEngine:
    """The first of ``primary, *fallbacks`` (System-2 engines) to complete (see the module docstring).

    With a ``tool_runner``, the chain moves on only while no tool has run: a tool's effects (a
    message sent, a row written) must not happen twice because a later engine redid the loop.
    """

    def __init__(self, primary: ChatEngine, *fallbacks: ChatEngine) -> None:
        self.engines: tuple[ChatEngine, ...] = (primary, *fallbacks)
        self.name = "fallback:" + ",".join(e.name for e in self.engines)
        self.model = primary.model

    @property
    def base_url(self) -> str | None:
        """Where every engine sends data when they all send it to one place; else ``None``.

        ``None`` keeps a ``local_only`` task from escalating through a chain that may leave the allow-list.
        """
        urls = {e.base_url for e in self.engines}
        return urls.pop() if len(urls) == 1 else None

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: ToolRunner | None = None,
    ) -> ChatResult:
        """The first engine's result; raises when none completed within the budget."""
        deadline = _chain_deadline(timeout_s)
        failures = _Failures([e.name for e in self.engines])
        ran: list[ToolCall] = []
        runner = _counting(tool_runner, ran) if tool_runner is not None else None
        for engine in self.engines:
            left = _remaining(deadline)
            if left is not None and left <= 0.0:
                break
            try:
                return await engine.complete(messages, tools=tools, schema=schema, timeout_s=left, tool_runner=runner)
            except Exception as exc:  # sorted by ``falls_back``; the rest is raised
                if ran:
                    raise  # tools have run: redoing the loop elsewhere would run them again
                failures.add(engine.name, exc)
                _fell_back(engine.name, exc)
        raise failures.final(deadline)

    async def aclose(self) -> None:
        await _close_all(self.engines)


def _fell_back(engine: str, error: BaseException) -> None:
    """An event on the current span: ``engine`` failed (``failures.add`` has raised what may not fall back)."""
    add_event(Event.FALLBACK, {Attr.ENGINE: engine, GenAI.ERROR_TYPE: type(error).__qualname__})


def _counting(runner: ToolRunner, ran: list[ToolCall]) -> Callable[[ToolCall], Awaitable[ToolOutcome]]:
    async def run(call: ToolCall) -> ToolOutcome:
        ran.append(call)
        return await runner(call)

    return run


async def _close_all(engines: Sequence[DecisionEngine | ChatEngine]) -> None:
    """Close every engine, even when one fails to; the first failure is raised after."""
    first: BaseException | None = None
    for engine in engines:
        try:
            await engine.aclose()
        except Exception as exc:  # raised below, once the rest are closed
            first = first or exc
    if first is not None:
        raise first
