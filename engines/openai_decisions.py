"""OpenAI's Decisions API (``POST /v1/decisions``) as a ``DecisionEngine``, through the official SDK.

Jev's question types map onto the API's as follows (wire-formats.md §4 and §7):

    noul   -> predicate  ``instructions`` (the yes/no descriptions folded in); reply ``probability`` = P(yes)
    choice -> choice     ``choices: [{value, description?}]``; reply ``probabilities[].{value, probability}``
    score  -> score      ``levels: [{label, description?}]``; reply ``probabilities[].{value (index), probability}``

The state goes in ``input`` (JSON-encoded unless it is a string; with images, one user message of
``input_text`` and ``input_image`` parts). Answers come back as an array in question order; each
question is named and read back by name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx2
from openai.types import Decision
from openai.types.decision_create_params import InputUnionMember1
from openai.types.decision_create_params import Question as WireQuestion

from fastslow.router import (
    Answer,
    Choice,
    EngineProtocolError,
    Image,
    NoAnswer,
    Noul,
    Question,
    ReadOptions,
    Score,
    State,
)
from fastslow.router.engine_api import (
    Deadline,
    EngineLimits,
    EngineReply,
    Usage,
    normalise_distribution,
    trace_headers,
)
from fastslow.router.settings import OpenAIDecisionsSettings

from ._http_limits import DEFAULT_MAX_REPLY_BYTES
from ._openai_sdk import OpenAISdkDecisionEngine
from ._sdk_errors import request_timeout

__all__ = ["MAX_IMAGES", "OpenAIDecisionsEngine"]

MAX_IMAGES = 128
"""Most images one request may hold (the API reference, wire-formats.md §4)."""

# Both limits come from the SDK's generated docstrings (``decision_create_params.py``): "Ask 1–400
# questions" and "Provide between 2 and 255 choices". A cap on score levels is not documented
# (UNKNOWN), so scores share the choice cap. Fireworks' compatible endpoint caps options at 208.
_LIMITS = EngineLimits(max_questions=400, max_options=255, accepts_images=True)

# A score level short enough to be its own label is sent as one; longer texts become descriptions of
# index labels, since the API shows labels as the names of the levels.
_MAX_LABEL_CHARS = 64


class OpenAIDecisionsEngine(OpenAISdkDecisionEngine[OpenAIDecisionsSettings]):
    """Answers typed questions with OpenAI's Decisions API.

    A refused question comes back as ``NoAnswer(reason="refusal")``; more than ``MAX_IMAGES``
    images is an ``InvalidRequest``.

    Args:
        settings: model, endpoint, key, time budget and retries. Without a key the SDK's
            ``OPENAI_API_KEY`` is used; a call with neither raises ``ConfigError``.
        http_client: an ``httpx2.AsyncClient`` to send requests through (tests pass one with a
            ``MockTransport``). The caller keeps ownership: ``aclose`` leaves it open, and the
            client is used as it is, without the reply cap.
        max_reply_bytes: the largest reply body the engine's own client reads
            (``limits.max_engine_reply_bytes``); a longer one is an ``EngineProtocolError``.
    """

    def __init__(
        self,
        settings: OpenAIDecisionsSettings,
        *,
        http_client: httpx2.AsyncClient | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        super().__init__(
            settings,
            name="openai-decisions",
            limits=_LIMITS,
            key_setting="openai_decisions.api_key",
            key_env="OPENAI_API_KEY",
            max_images=MAX_IMAGES,
            http_client=http_client,
            max_reply_bytes=max_reply_bytes,
        )

    async def _ask(
        self,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],
        options: ReadOptions,  # noqa: ARG002 - the API takes no seed, samples or steps
        *,
        deadline: Deadline,
    ) -> EngineReply:
        started = time.perf_counter()
        decision = await self._client.decisions.create(
            model=self._settings.model,
            input=_input(state, images),
            questions=[_question(name, q) for name, q in questions.items()],
            timeout=request_timeout(deadline, self.name),
            extra_headers=trace_headers(),
        )
        latency = (time.perf_counter() - started) * 1000.0
        try:
            answers = _read_answers(decision, questions, engine=self.name, latency_ms=latency)
            usage = Usage(input_tokens=decision.usage.input_tokens, output_tokens=decision.usage.output_tokens)
            model = decision.model
        except (AttributeError, TypeError, ValueError) as exc:
            # The SDK builds replies without validating them; a body missing fields surfaces here.
            raise EngineProtocolError(f"cannot read the decision: {exc}", engine=self.name) from exc
        return EngineReply(answers=answers, engine=self.name, model=model, latency_ms=latency, usage=usage)


def _input(state: State, images: Sequence[Image]) -> str | list[InputUnionMember1]:
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False)
    if not images:
        return text
    parts: list[Any] = [{"type": "input_text", "text": text}] if text else []
    parts.extend({"type": "input_image", "image_url": image.data_url()} for image in images)
    return [{"role": "user", "type": "message", "content": parts}]


def _question(name: str, question: Question) -> WireQuestion:
    if isinstance(question, Noul):
        return {"type": "predicate", "name": name, "instructions": _predicate_instructions(question)}
    if isinstance(question, Choice):
        choices: list[Any] = [
            {"value": option} if description is None else {"value": option, "description": description}
            for option, description in question.criteria.items()
        ]
        return {
            "type": "choice",
            "name": name,
            "instructions": question.instructions or "Choose the option that best fits the input.",
            "choices": choices,
        }
    return {
        "type": "score",
        "name": name,
        "instructions": question.instructions or "Rate the input on these levels, lowest first.",
        "levels": _levels(question),
    }


def _predicate_instructions(question: Noul) -> str:
    # A predicate has no criteria, so the outcome descriptions become part of its statement.
    parts = [question.instructions.strip()] if question.instructions and question.instructions.strip() else []
    if question.yes:
        parts.append(f"True (yes) when: {question.yes}")
    if question.no:
        parts.append(f"False (no) when: {question.no}")
    return "\n".join(parts)


def _levels(question: Score) -> list[Any]:
    texts = list(question.levels)
    as_labels = len(set(texts)) == len(texts) and all(
        t.strip() and len(t) <= _MAX_LABEL_CHARS and "\n" not in t for t in texts
    )
    if as_labels:
        return [{"label": t} for t in texts]
    return [{"label": str(i), "description": t} for i, t in enumerate(texts)]


def _read_answers(
    decision: Decision, questions: Mapping[str, Question], *, engine: str, latency_ms: float
) -> dict[str, Answer | NoAnswer]:
    returned = list(decision.answers)
    by_name = {a.name: a for a in returned if a.name is not None}
    out: dict[str, Answer | NoAnswer] = {}
    for i, (name, question) in enumerate(questions.items()):
        answer = by_name.get(name)
        if answer is None and i < len(returned) and returned[i].name is None:
            answer = returned[i]  # unnamed, but answers come in question order
        out[name] = _one(name, question, answer, engine=engine, model=decision.model, latency_ms=latency_ms)
    return out


def _one(
    name: str, question: Question, answer: Any, *, engine: str, model: str, latency_ms: float
) -> Answer | NoAnswer:
    def no(reason: str) -> NoAnswer:
        return NoAnswer(
            question=name, kind=question.kind, reason=reason, engine=engine, model=model, latency_ms=latency_ms
        )

    kind = getattr(answer, "type", None)
    probs: dict[str, float]
    if answer is None:
        return no("no answer returned")
    if kind == "refusal":
        return no("refusal")
    if kind == "predicate" and isinstance(question, Noul):
        p = min(1.0, max(0.0, float(answer.probability)))
        probs = {"yes": p, "no": 1.0 - p}
    elif kind == "choice" and isinstance(question, Choice):
        # Values are typed; we only send strings, so a boolean value cannot be one of our options.
        probs = {e.value: float(e.probability) for e in answer.probabilities if isinstance(e.value, str)}
    elif kind == "score" and isinstance(question, Score):
        probs = {str(e.value): float(e.probability) for e in answer.probabilities}
    else:
        return no(f"unsupported answer type {kind!r} for a {question.kind}")
    return Answer(
        question=name,
        kind=question.kind,
        probabilities=normalise_distribution(question, probs, engine=engine),
        engine=engine,
        model=model,
        latency_ms=latency_ms,
    )
