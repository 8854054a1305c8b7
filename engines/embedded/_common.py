"""Helpers shared by the embedded engines: state text, answers, time budgets."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Mapping, Sequence
from typing import TypeVar

from fastslow.router import (
    Answer,
    EngineTimeout,
    EngineUnavailable,
    Image,
    InvalidRequest,
    Question,
    ReadOptions,
    State,
)
from fastslow.router.engine_api import Abandoned, Signals, budget_s, neutralise, normalise_distribution, validate_state

__all__ = ["as_text", "check_call", "make_answer", "option_text", "with_budget"]

T = TypeVar("T")

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def check_call(
    engine: str, closed: bool, state: State, questions: Mapping[str, Question], images: Sequence[Image]
) -> State:
    """Validate one call and return the state with control strings neutralised."""
    if closed:
        raise EngineUnavailable("engine is closed", engine=engine)
    if images:
        raise InvalidRequest("images", f"engine {engine!r} does not take images")
    if not questions:
        raise InvalidRequest("questions", "at least one question is needed")
    return neutralise(validate_state(state))  # type: ignore[no-any-return]


def as_text(state: State) -> str:
    """The state as one string for an embedder: strings as they are, JSON compactly."""
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False, separators=(",", ":"))


def option_text(name: str, description: str | None) -> str:
    """How an option reads to an embedder: ``"lost card: card stolen or missing"``."""
    words = _CAMEL.sub(" ", name).replace("_", " ").replace("-", " ").strip().lower()
    return f"{words}: {description.strip()}" if description and description.strip() else words


def make_answer(
    name: str,
    question: Question,
    probs: Mapping[str, float],
    *,
    engine: str,
    model: str,
    latency_ms: float,
    read_all: bool | None = None,
    agreement: float | None = None,
) -> Answer:
    """An engine's answer; ``read_all`` False when it read only part of the state (a check's token
    budget); ``agreement`` the share of an ensemble's encoders whose own top option it is."""
    return Answer(
        question=name,
        kind=question.kind,
        probabilities=normalise_distribution(question, probs, engine=engine),
        engine=engine,
        model=model,
        latency_ms=latency_ms,
        signals=Signals(read_all=read_all, agreement=agreement),
    )


async def with_budget(call: Awaitable[T], options: ReadOptions | None, *, engine: str) -> T:
    """Await ``call`` within ``options.timeout_s`` and the request's deadline, raising ``EngineTimeout``.

    Cancelling ``call`` at the budget tells its worker thread to stop (``run_blocking``), so the
    work ends within one step of the budget instead of running on for later requests to wait out.
    """
    own = options.timeout_s if options is not None else None
    timeout = budget_s(own)
    try:
        async with asyncio.timeout(timeout):
            return await call
    except (TimeoutError, Abandoned):
        shown = f"{timeout:g} s" if timeout is not None else "its deadline"
        raise EngineTimeout(f"no answer within {shown}", engine=engine) from None
