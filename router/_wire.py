"""Jev ``/v1/systemone`` bodies: parse a request, render a reply in Jev's exact response shape.

Used wherever fastslow *serves* the Jev format (``fastslow decide``, the HTTP gateway); the Jev
client in ``fastslow.engines.jev`` has its own, more forgiving, reader for what servers send back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._answers import Answer, EngineReply
from ._engine import ReadOptions
from ._errors import InvalidRequest
from ._questions import MAX_STATE_CHARS, Question, Score, State, questions_from_wire, validate_state
from ._settings import LimitsSettings

__all__ = ["SystemOneRequest", "parse_systemone_request", "render_systemone_reply"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemOneRequest:
    """A parsed Jev request body."""

    state: State
    questions: Mapping[str, Question]
    model: str | None = None
    options: ReadOptions = field(default_factory=ReadOptions)


def _int_field(body: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRequest(key, f"must be an integer from {low} to {high}")
    return value


def _nesting(value: Any, max_depth: int) -> int:
    """How deep ``value`` nests objects and arrays, on an explicit stack; stops past ``max_depth``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and deepest <= max_depth:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((child, depth + 1) for child in node)
        else:
            continue
        deepest = max(deepest, depth)
    return deepest


def _check_questions(questions: Any, limits: LimitsSettings) -> None:
    """The work limits of a ``questions`` map, checked before anything is built from it."""
    if not isinstance(questions, Mapping):
        return  # questions_from_wire names what is wrong with it
    if len(questions) > limits.max_questions:
        raise InvalidRequest(
            "questions", f"{len(questions)} questions; the limit is limits.max_questions ({limits.max_questions})"
        )
    for name, question in questions.items():
        criteria = question.get("criteria") if isinstance(question, Mapping) else None
        if isinstance(criteria, (Mapping, list)) and len(criteria) > limits.max_options:
            # The name goes into the error body, so a lone surrogate in it is shown escaped.
            shown = str(name).encode("utf-8", "backslashreplace").decode("utf-8")
            where = f"questions.{shown}.criteria"
            raise InvalidRequest(
                where,
                f"{len(criteria)} options or levels; the limit is limits.max_options ({limits.max_options})",
            )
    # Instructions and criteria may be objects or arrays, JSON-encoded for the engines.
    if _nesting(questions, limits.max_depth) > limits.max_depth:
        raise InvalidRequest(
            "questions", f"nested deeper than limits.max_depth ({limits.max_depth} levels of objects and arrays)"
        )


def parse_systemone_request(
    raw: str | bytes | Mapping[str, Any],
    *,
    max_state_chars: int = MAX_STATE_CHARS,
    limits: LimitsSettings | None = None,
) -> SystemOneRequest:
    """Parse and validate a request body; every error names the offending field.

    Every work limit (``limits``: questions, options, depth; ``max_state_chars``) is checked
    before any question is built, so nothing an engine would do is spent on a refused request.
    """
    limits = limits if limits is not None else LimitsSettings()
    if isinstance(raw, (str, bytes)):
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidRequest("body", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        except RecursionError:
            raise InvalidRequest(
                "body", f"nested deeper than limits.max_depth ({limits.max_depth} levels of objects and arrays)"
            ) from None
        except ValueError as exc:  # bytes that are not text, an integer of too many digits
            raise InvalidRequest("body", f"invalid JSON: {exc}") from None
    else:
        body = raw
    if not isinstance(body, Mapping):
        raise InvalidRequest("body", "the request body must be a JSON object")
    if "state" not in body:
        raise InvalidRequest("state", "field required")
    state = validate_state(body["state"], max_chars=max_state_chars, max_depth=limits.max_depth)
    _check_questions(body.get("questions"), limits)
    questions = questions_from_wire(body.get("questions"))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model", "must be a string")
    samples = body.get("samples")
    if samples is not None and samples != "auto":
        samples = _int_field(body, "samples", 1, 32)
    options = ReadOptions(
        samples=samples,
        steps=_int_field(body, "steps", 1, 8),
        think=_int_field(body, "think", 0, 4096) or 0,
        seed=_int_field(body, "seed", -(2**63), 2**63 - 1),
    )
    return SystemOneRequest(state=state, questions=questions, model=model, options=options)


def _render_answer(answer: Answer, question: Question) -> dict[str, Any]:
    probs = answer.probabilities
    if answer.kind == "noul":
        return {"type": "noul", "noul": probs["yes"]}
    if answer.kind == "choice":
        return {
            "type": "choice",
            "choice": answer.top,
            "confidence": answer.confidence,
            "probabilities": dict(probs),
        }
    assert isinstance(question, Score)
    return {
        "type": "score",
        "score": answer.expected,
        "confidence": answer.confidence,
        "legend": {str(i): level for i, level in enumerate(question.levels)},
        "probabilities": dict(probs),
    }


def render_systemone_reply(reply: EngineReply, questions: Mapping[str, Question]) -> dict[str, Any]:
    """Jev's response body for ``reply``.

    A question without a usable answer is rendered with type ``no_answer`` and the reason: the
    official SDK drops unknown answer types with a warning, whereas it fails on ``null``.
    """
    answers: dict[str, Any] = {}
    for name, question in questions.items():
        answer = reply.answers[name]
        if isinstance(answer, Answer):
            answers[name] = _render_answer(answer, question)
        else:
            answers[name] = {"type": "no_answer", "reason": answer.reason}
    return {
        "model": reply.model,
        "answers": answers,
        "usage": {"input_tokens": reply.usage.input_tokens, "output_tokens": reply.usage.output_tokens},
    }
