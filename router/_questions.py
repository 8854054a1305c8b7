"""Typed questions: ``Noul`` (yes/no), ``Choice`` (named options) and ``Score`` (ordered levels).

Every question exposes ``options``: the names its answer distribution is keyed by. A noul is
keyed ``yes``/``no``, a choice by its option names, a score by level index ``"0"``, ``"1"``, ...
(as on Jev's wire), with the level texts kept in ``levels``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ._errors import InvalidRequest

__all__ = [
    "MAX_STATE_CHARS",
    "NOUL_OPTIONS",
    "Choice",
    "Image",
    "Noul",
    "Question",
    "QuestionKind",
    "Score",
    "State",
    "question_from_wire",
    "question_to_wire",
    "questions_from_wire",
    "validate_state",
]

QuestionKind: TypeAlias = Literal["noul", "choice", "score"]
State: TypeAlias = str | Mapping[str, Any] | Sequence[Any]
"""What every question of one call is about: a string, a JSON object or a JSON array."""

NOUL_OPTIONS: tuple[str, str] = ("yes", "no")
MAX_STATE_CHARS = 1_000_000
"""Largest state we send anywhere (Jev's long-context mode tops out at 768 KiB)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Noul:
    """A yes/no question; its answer is keyed ``yes`` and ``no``."""

    instructions: str | None = None
    """The statement or question; may be omitted when ``yes``/``no`` describe the outcomes."""
    yes: str | None = None
    """What a ``yes`` (true) answer means, sent as ``criteria.true``."""
    no: str | None = None
    """What a ``no`` (false) answer means, sent as ``criteria.false``."""

    kind: Literal["noul"] = field(default="noul", init=False)

    def __post_init__(self) -> None:
        if not _text(self.instructions) and not _text(self.yes) and not _text(self.no):
            raise InvalidRequest("instructions", "a noul needs instructions or a described outcome")

    @property
    def options(self) -> tuple[str, ...]:
        return NOUL_OPTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    """Pick one of named options.

    ``options`` keeps insertion order; a description of ``None`` means the name speaks for itself.
    """

    criteria: Mapping[str, str | None]
    """Option name -> description (or ``None``)."""
    instructions: str | None = None

    kind: Literal["choice"] = field(default="choice", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.criteria, Mapping):
            raise InvalidRequest("criteria", "a choice needs criteria: {option: description}")
        if len(self.criteria) < 2:
            raise InvalidRequest("criteria", "a choice needs at least 2 options")
        for name in self.criteria:
            if not isinstance(name, str) or not name.strip():
                raise InvalidRequest("criteria", "option names must be non-empty strings")
        # Freeze a private copy so the caller's dict cannot change the question afterwards.
        object.__setattr__(self, "criteria", dict(self.criteria))

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(self.criteria)


@dataclass(frozen=True, slots=True, kw_only=True)
class Score:
    """Rate on ordered levels, lowest first; the answer is keyed by level index."""

    levels: Sequence[str]
    """Level descriptions, lowest first; a level's position is its score."""
    instructions: str | None = None

    kind: Literal["score"] = field(default="score", init=False)

    def __post_init__(self) -> None:
        if isinstance(self.levels, str) or not isinstance(self.levels, Sequence):
            raise InvalidRequest("criteria", "a score needs criteria: a list of levels, lowest first")
        if len(self.levels) < 2:
            raise InvalidRequest("criteria", "a score needs at least 2 levels")
        object.__setattr__(self, "levels", tuple(str(level) for level in self.levels))

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(str(i) for i in range(len(self.levels)))


Question: TypeAlias = Noul | Choice | Score


@dataclass(frozen=True, slots=True, kw_only=True)
class Image:
    """An image a question may refer to (Jev ``assets``, the structured server's ``images``)."""

    data: bytes
    format: Literal["png", "jpeg"] = "png"
    placeholder: str | None = None
    """The text in ``state`` the image stands for (Jev replaces it with the image)."""

    @property
    def media_type(self) -> str:
        return f"image/{self.format}"

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode()}"


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.strip() if isinstance(value, str) else json.dumps(value)


def _as_text(value: Any, field_name: str) -> str | None:
    """Jev allows string, object or array instructions; engines read text, so JSON-encode."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, ensure_ascii=False)
    raise InvalidRequest(field_name, f"expected a string, object or array, got {type(value).__name__}")


def question_from_wire(name: str, body: Any) -> Question:
    """Parse one Jev-shaped question (``{"type": ..., "instructions": ..., "criteria": ...}``)."""
    where = f"questions.{name}"
    if not isinstance(body, Mapping):
        raise InvalidRequest(where, "a question must be an object")
    kind = body.get("type")
    instructions = _as_text(body.get("instructions"), f"{where}.instructions")
    criteria = body.get("criteria")
    try:
        if kind == "noul":
            if criteria is not None and not isinstance(criteria, Mapping):
                raise InvalidRequest("criteria", 'noul criteria must be {"true": ..., "false": ...}')
            crit = criteria or {}
            unknown = set(crit) - {"true", "false"}
            if unknown:
                raise InvalidRequest("criteria", f"noul criteria keys are true/false, not {sorted(unknown)}")
            return Noul(
                instructions=instructions,
                yes=_as_text(crit.get("true"), f"{where}.criteria.true"),
                no=_as_text(crit.get("false"), f"{where}.criteria.false"),
            )
        if kind == "choice":
            if not isinstance(criteria, Mapping):
                raise InvalidRequest("criteria", "a choice needs criteria: {option: description}")
            return Choice(
                criteria={str(k): _as_text(v, f"{where}.criteria.{k}") for k, v in criteria.items()},
                instructions=instructions,
            )
        if kind == "score":
            if not isinstance(criteria, list):
                raise InvalidRequest("criteria", "a score needs criteria: a list of levels")
            return Score(
                levels=[_as_text(v, f"{where}.criteria") or "" for v in criteria],
                instructions=instructions,
            )
    except InvalidRequest as exc:
        sub = f"{where}.{exc.field}" if exc.field and not exc.field.startswith(where) else exc.field
        raise InvalidRequest(sub or where, exc.message) from None
    raise InvalidRequest(f"{where}.type", f"unknown question type {kind!r}; expected noul, choice or score")


def questions_from_wire(body: Any) -> dict[str, Question]:
    """Parse a Jev ``questions`` map."""
    if not isinstance(body, Mapping) or not body:
        raise InvalidRequest("questions", "questions must be a non-empty object {name: question}")
    out: dict[str, Question] = {}
    for name, q in body.items():
        if not isinstance(name, str) or not name or ":" in name or "\n" in name:
            raise InvalidRequest(f"questions.{name}", "question names must be non-empty, without ':' or newlines")
        out[name] = question_from_wire(name, q)
    return out


def question_to_wire(question: Question) -> dict[str, Any]:
    """The Jev wire form of a question (what ``typesafe-sdk`` sends for it)."""
    body: dict[str, Any] = {"type": question.kind}
    if question.instructions is not None:
        body["instructions"] = question.instructions
    if isinstance(question, Noul):
        if question.yes is not None or question.no is not None:
            body["criteria"] = {"true": question.yes, "false": question.no}
    elif isinstance(question, Choice):
        body["criteria"] = dict(question.criteria)
    else:
        body["criteria"] = list(question.levels)
    return body


def validate_state(state: Any, *, max_chars: int = MAX_STATE_CHARS) -> State:
    """Check that ``state`` is a string, object or array of JSON values and not oversized."""
    if isinstance(state, str):
        size = len(state)
    elif isinstance(state, (Mapping, list, tuple)):
        try:
            size = len(json.dumps(state, ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            raise InvalidRequest("state", f"state must be JSON-serialisable: {exc}") from None
    else:
        raise InvalidRequest("state", f"state must be a string, object or array, not {type(state).__name__}")
    if size > max_chars:
        raise InvalidRequest("state", f"state is {size} characters; the limit is {max_chars}")
    checked: State = state
    return checked
