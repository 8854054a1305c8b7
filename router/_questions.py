"""Typed questions: ``Noul`` (yes/no), ``Choice`` (named options) and ``Score`` (ordered levels).

Every question exposes ``options``: the names its answer distribution is keyed by. A noul is
keyed ``yes``/``no``, a choice by its option names, a score by level index ``"0"``, ``"1"``, ...
(as on Jev's wire), with the level texts kept in ``levels``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any, Literal, TypeAlias

from ._errors import InvalidRequest

__all__ = [
    "MAX_STATE_CHARS",
    "MAX_STATE_DEPTH",
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
MAX_STATE_CHARS = 100_000
"""Largest state (compact JSON characters) an engine takes unless told otherwise (``max_state_chars``)."""
MAX_STATE_DEPTH = 512
"""Deepest nesting of a state an engine takes unless told otherwise: the most ``limits.max_depth``
allows, and well inside what ``json.dumps`` encodes without reaching the recursion limit."""
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _is_text(value: str) -> bool:
    """Whether ``value`` is Unicode text: no lone surrogate (from a ``\\ud800`` JSON escape), which
    no UTF-8 encoder takes, so it would fail wherever the text is sent or rendered."""
    return value.isascii() or _LONE_SURROGATE.search(value) is None


def _shown(name: str) -> str:
    # Names go into error fields, which are JSON-encoded: a lone surrogate is shown escaped.
    return name.encode("utf-8", "backslashreplace").decode("utf-8")


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
            if not _is_text(name):
                raise InvalidRequest(
                    f"criteria.{_shown(name)}", "option names must be Unicode text (a lone surrogate is not)"
                )
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
        levels = tuple(str(level) for level in self.levels)
        for i, level in enumerate(levels):
            if not _is_text(level):
                raise InvalidRequest(f"criteria.{i}", "levels must be Unicode text (a lone surrogate is not)")
        object.__setattr__(self, "levels", levels)

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
        if not _is_text(name):
            raise InvalidRequest(
                f"questions.{_shown(name)}", "question names must be Unicode text (a lone surrogate is not)"
            )
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


def _scalar_chars(value: Any) -> int:
    """Characters of a JSON scalar as ``json.dumps`` writes it (``TypeError`` for what it refuses)."""
    if isinstance(value, str):
        return len(encode_basestring(value))
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, int):
        return len(int.__repr__(value))  # ValueError past Python's digit limit, as json.dumps
    if isinstance(value, float):
        if math.isfinite(value):
            return len(float.__repr__(value))
        return 3 if math.isnan(value) else (8 if value > 0 else 9)  # NaN, Infinity, -Infinity
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _key_chars(key: Any) -> int:
    # json.dumps writes str, int, float, bool and None keys as strings, and refuses any other.
    if isinstance(key, str):
        return len(encode_basestring(key))
    if key is None or isinstance(key, (bool, int, float)):
        return _scalar_chars(key) + 2
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _json_size(state: Any, *, max_chars: int, max_depth: int) -> int:
    """``len`` of ``state`` as compact JSON, measured on an explicit stack (no recursion to exhaust).

    Stops as soon as the size passes ``max_chars`` (returning what it counted so far) and raises
    ``InvalidRequest`` at the first object or array deeper than ``max_depth``.
    """
    size = 0
    stack: list[tuple[Any, int]] = [(state, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Sequence[Any] = list(node.values())
            size += 2 + max(len(node) - 1, 0) + sum(_key_chars(k) + 1 for k in node)
        elif isinstance(node, (list, tuple)):
            children = node
            size += 2 + max(len(node) - 1, 0)
        else:
            size += _scalar_chars(node)
            if size > max_chars:
                return size
            continue
        if depth > max_depth:
            raise InvalidRequest(
                "state", f"state is nested deeper than limits.max_depth ({max_depth} levels of objects and arrays)"
            )
        if size > max_chars:
            return size
        stack.extend((child, depth + 1) for child in children)
    return size


def validate_state(state: Any, *, max_chars: int = MAX_STATE_CHARS, max_depth: int = MAX_STATE_DEPTH) -> State:
    """Check that ``state`` is a string, object or array of JSON values, not oversized nor over-deep.

    An object or array is measured as compact JSON without recursion and without encoding it, so a
    state of any depth or size is refused cheaply (at most ``max_chars`` worth of it is looked at).
    """
    if isinstance(state, str):
        size = len(state)
    elif isinstance(state, (Mapping, list, tuple)):
        if not isinstance(state, (dict, list, tuple)):
            raise InvalidRequest("state", f"state must be JSON-serialisable: a {type(state).__name__} is not a dict")
        try:
            size = _json_size(state, max_chars=max_chars, max_depth=max_depth)
        except InvalidRequest:
            raise
        except (TypeError, ValueError) as exc:
            raise InvalidRequest("state", f"state must be JSON-serialisable: {exc}") from None
    else:
        raise InvalidRequest("state", f"state must be a string, object or array, not {type(state).__name__}")
    if size > max_chars:
        shown = f"{size}" if isinstance(state, str) else f"over {max_chars}"
        raise InvalidRequest("state", f"state is {shown} characters; the limit is {max_chars} (max_state_chars)")
    checked: State = state
    return checked
