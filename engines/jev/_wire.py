"""Jev's ``/v1/systemone`` body: build it from router questions, read replies back into answers.

Reading survives every trap in ``wire-formats.md``: ``null`` answers, list-valued ``legend``, answer
types we do not model (``unsupported``, ``box``, ``refusal``), distributions that do not sum to 1 or
miss labels, score keys as strings, nouls with only ``noul`` or with ``probabilities {true, false}``,
the structured server's ``diagnostics`` and llm2jev's extra ``id``. The wire ``confidence`` is never read.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from fastslow.router import (
    Answer,
    Choice,
    EngineProtocolError,
    Image,
    InvalidRequest,
    NoAnswer,
    Noul,
    Question,
    ReadOptions,
    Score,
    State,
)
from fastslow.router.engine_api import (
    EngineReply,
    Usage,
    neutralise,
    neutralise_text,
    normalise_distribution,
    question_to_wire,
)

from ._diagnostics import number, read_signals, reads_by_question
from ._profiles import JevProfile

__all__ = [
    "DEFAULT_NOUL_CRITERIA",
    "GENERIC_INSTRUCTIONS",
    "WireQuestion",
    "WireRequest",
    "build_request",
    "encode_body",
    "parse_reply",
]

GENERIC_INSTRUCTIONS: dict[str, str] = {
    "noul": "Does the statement hold for the state?",
    "choice": "Which option best fits the state?",
    "score": "Which level best fits the state?",
}
"""Sent to servers that require ``instructions`` when a question has none."""

DEFAULT_NOUL_CRITERIA: dict[str, str] = {"true": "the statement holds", "false": "the statement does not hold"}
"""Sent to servers that require both noul outcomes described when a question leaves one out."""

_SHOWN_CHARS = 80
"""How much of an upstream's value a reason quotes: reasons reach decision details and gateway replies."""


@dataclass(frozen=True, slots=True)
class WireQuestion:
    """A question as sent: the caller's name and question, and the neutralised copy on the wire."""

    name: str
    question: Question
    wire: Question
    """Same kind and option order as ``question``; control strings neutralised."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WireRequest:
    """A built request: the JSON body, how to map answers back, and any multipart image parts."""

    body: dict[str, Any]
    questions: dict[str, WireQuestion]
    """Keyed by the name on the wire, in the order asked."""
    model: str
    """The model sent (``""`` when none was)."""
    parts: tuple[tuple[str, Image], ...] = ()
    """``(part name, image)`` for a multipart body; empty for plain JSON."""


def _opt(text: str | None) -> str | None:
    return None if text is None else neutralise_text(text)


def _neutral_question(question: Question) -> Question:
    if isinstance(question, Noul):
        return Noul(instructions=_opt(question.instructions), yes=_opt(question.yes), no=_opt(question.no))
    if isinstance(question, Choice):
        criteria = {neutralise_text(k): _opt(v) for k, v in question.criteria.items()}
        if len(criteria) != len(question.criteria):
            raise InvalidRequest("criteria", "option names collide once control strings are neutralised")
        return Choice(criteria=criteria, instructions=_opt(question.instructions))
    return Score(levels=[neutralise_text(level) for level in question.levels], instructions=_opt(question.instructions))


def _wire_name(name: str) -> str:
    # The structured server rejects ':' and newlines in question ids.
    return neutralise_text(name).replace(":", "_").replace("\n", " ").replace("\r", " ")


def _question_body(question: Question, profile: JevProfile) -> dict[str, Any]:
    body = question_to_wire(question)
    if profile.needs_instructions and not body.get("instructions"):
        body["instructions"] = GENERIC_INSTRUCTIONS[question.kind]
    if profile.noul_needs_both_criteria and isinstance(question, Noul):
        body["criteria"] = {
            "true": question.yes or DEFAULT_NOUL_CRITERIA["true"],
            "false": question.no or DEFAULT_NOUL_CRITERIA["false"],
        }
    return body


def _extensions(profile: JevProfile, options: ReadOptions) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "samples" in profile.extensions and options.samples is not None:
        out["samples"] = options.samples
    if "steps" in profile.extensions and options.steps is not None:
        out["steps"] = options.steps
    if "think" in profile.extensions and (options.think or profile.always_think):
        out["think"] = options.think
    if "seed" in profile.extensions and options.seed is not None:
        out["seed"] = options.seed
    return out


def _with_placeholders(state: Any, missing: Sequence[str]) -> Any:
    """Put placeholders that appear nowhere into the state, so the server sees every image."""
    if not missing:
        return state
    if isinstance(state, str):
        return "\n\n".join([state, *missing]) if state else "\n".join(missing)
    if isinstance(state, Mapping):
        key = "images" if "images" not in state else "attached_images"
        return {**state, key: list(missing)}
    return [*state, *missing]


def _placeholder(image: Image) -> str:
    if image.placeholder:
        return neutralise_text(image.placeholder)
    return f"<image:{hashlib.blake2b(image.data, digest_size=16).hexdigest()}>"


_WIRE_CACHE: dict[tuple[str, int, str], tuple[Question, str, WireQuestion, dict[str, Any]]] = {}
_WIRE_CACHE_ENTRIES = 4096


def _wire_question(name: str, question: Question, profile: JevProfile) -> tuple[str, WireQuestion, dict[str, Any]]:
    """A question's wire name, its neutralised copy and its JSON body, made once per policy question.

    A policy's questions are asked on every call; neutralising their texts again each time was a
    tenth of a stubbed call. Keyed by identity (a question's mappings make it unhashable), and the
    question itself is kept and compared, so a reused ``id`` never returns another question's
    body. The bodies are shared: nothing may change them.
    """
    key = (name, id(question), profile.name)
    hit = _WIRE_CACHE.get(key)
    if hit is not None and hit[0] is question:
        return hit[1], hit[2], hit[3]
    wire_name = _wire_name(name)
    wq = WireQuestion(name, question, _neutral_question(question))
    made = (question, wire_name, wq, _question_body(wq.wire, profile))
    if len(_WIRE_CACHE) >= _WIRE_CACHE_ENTRIES:
        _WIRE_CACHE.clear()  # questions of passing requests (the HTTP pass-through): start again
    _WIRE_CACHE[key] = made
    return wire_name, wq, made[3]


def build_request(
    state: State,
    questions: Mapping[str, Question],
    *,
    profile: JevProfile,
    model: str | None,
    options: ReadOptions | None = None,
    images: Sequence[Image] = (),
    multipart: bool = False,
) -> WireRequest:
    """Build the body for ``questions`` about ``state`` as ``profile``'s server expects it.

    The state, question texts, option names and question names are neutralised first, so control
    strings such as ``<|channel>`` in user text never reach the model as specials.
    """
    opts = options or ReadOptions()
    wire_questions: dict[str, WireQuestion] = {}
    bodies: dict[str, dict[str, Any]] = {}
    for name, question in questions.items():
        wire_name, wq, question_body = _wire_question(name, question, profile)
        if wire_name in wire_questions:
            raise InvalidRequest(f"questions.{name}", "question names collide on the wire")
        wire_questions[wire_name] = wq
        bodies[wire_name] = question_body

    body: dict[str, Any] = {}
    if model:
        body["model"] = model
    body["state"] = neutralise(state)
    body["questions"] = bodies
    body.update(_extensions(profile, opts))

    parts: list[tuple[str, Image]] = []
    if images:
        if profile.images == "none":
            raise InvalidRequest("images", f"the {profile.name} profile takes no images")
        if profile.images == "images":
            body["images"] = [image.data_url() for image in images]
        else:
            placeholders = [_placeholder(image) for image in images]
            text = json.dumps([body["state"], body["questions"]], ensure_ascii=False)
            missing = [p for p in dict.fromkeys(placeholders) if p not in text]
            body["state"] = _with_placeholders(body["state"], missing)
            assets: dict[str, Any] = {}
            for placeholder, image in zip(placeholders, images, strict=True):
                if placeholder in assets:
                    continue
                if multipart:
                    part = f"asset-{len(parts)}"
                    parts.append((part, image))
                    assets[placeholder] = {"type": "image", "part": part}
                else:
                    data = base64.b64encode(image.data).decode("ascii")
                    assets[placeholder] = {"type": "image", "format": image.format, "data_base64": data}
            body["assets"] = assets
    return WireRequest(body=body, questions=wire_questions, model=model or "", parts=tuple(parts))


def encode_body(request: WireRequest) -> tuple[bytes, str]:
    """The request's bytes and content type: JSON, or multipart with the JSON as part ``request``."""
    payload = json.dumps(request.body, ensure_ascii=False).encode("utf-8")
    if not request.parts:
        return payload, "application/json"
    boundary = uuid4().hex
    chunks: list[bytes] = []
    sections: list[tuple[str, str, bytes, str | None]] = [("request", "application/json", payload, None)]
    sections += [(name, image.media_type, image.data, name) for name, image in request.parts]
    for name, content_type, content, filename in sections:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        head = f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: {content_type}\r\n\r\n"
        chunks += [head.encode("ascii"), content, b"\r\n"]
    chunks.append(f"--{boundary}--\r\n".encode("ascii"))
    return b"".join(chunks), f"multipart/form-data; boundary={boundary}"


# --- replies -----------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: the upstream chooses it, and a reason must not carry a whole body."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _noul_probs(answer: Mapping[str, Any]) -> dict[str, float] | str:
    extra = answer.get("probabilities")
    if isinstance(extra, Mapping):
        for yes_key, no_key in (("true", "false"), ("yes", "no")):
            if yes_key in extra and no_key in extra:  # the Google fork's {"true", "false"}
                return {"yes": extra[yes_key], "no": extra[no_key]}
    p = number(answer.get("noul"))
    if p is None or not -1e-6 <= p <= 1 + 1e-6:
        return f"noul answer has no probability in [0, 1]: {_shown(answer.get('noul'))}"
    p = min(1.0, max(0.0, p))
    return {"yes": p, "no": 1.0 - p}


def _score_probs(answer: Mapping[str, Any], levels: Sequence[str]) -> dict[str, float] | str:
    raw = answer.get("probabilities")
    if isinstance(raw, list):  # by position
        raw = {str(i): p for i, p in enumerate(raw)}
    if not isinstance(raw, Mapping):
        return "score answer has no probabilities"
    by_text = {level: str(i) for i, level in enumerate(levels)}
    legend = answer.get("legend")  # a dict {"0": name} on Jev, a list on jev-compatible-server
    if isinstance(legend, list):
        by_text.update({str(name): str(i) for i, name in enumerate(legend)})
    elif isinstance(legend, Mapping):
        by_text.update({str(name): str(k).strip() for k, name in legend.items()})
    out: dict[str, float] = {}
    for key, p in raw.items():
        text = str(key).strip()
        index = str(int(text)) if text.isascii() and text.isdigit() else by_text.get(text)
        value = number(p)
        if value is None:
            return f"score probability of {_shown(text)} is not a number: {_shown(p)}"
        if index is not None:
            out[index] = out.get(index, 0.0) + value
    return out


def _probabilities(answer: Any, question: Question) -> dict[str, float] | str:
    """The answer's raw distribution over the wire question's options, or why there is none."""
    if answer is None:
        return "null answer (the server skipped the question)"
    if not isinstance(answer, Mapping):
        return f"malformed answer: {type(answer).__name__}"
    kind = answer.get("type", question.kind)
    if kind == "refusal":
        return "refusal"
    if kind not in ("noul", "choice", "score"):
        why = answer.get("reason")
        return f"unsupported answer type {_shown(kind)}" + (f" ({_shown(why)})" if isinstance(why, str) else "")
    if kind != question.kind:
        return f"answer type {_shown(kind)} does not match question type {question.kind!r}"
    if isinstance(question, Noul):
        return _noul_probs(answer)
    if isinstance(question, Score):
        return _score_probs(answer, question.levels)
    raw = answer.get("probabilities")
    if not isinstance(raw, Mapping):
        return "choice answer has no probabilities"
    return {str(k): v for k, v in raw.items()}


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, Mapping):
        return Usage()
    counts = [raw.get("input_tokens"), raw.get("output_tokens")]
    ints = [_count(c) for c in counts]
    return Usage(input_tokens=ints[0], output_tokens=ints[1])


def _count(value: Any) -> int:
    """A token count from the wire; anything that is not a finite non-negative number counts 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return 0
    return value if isinstance(value, int) else int(value) if math.isfinite(value) else 0


def parse_reply(
    payload: Any,
    request: WireRequest,
    *,
    engine: str,
    latency_ms: float = 0.0,
    server_labels: bool = False,
) -> EngineReply:
    """Read a decoded 2xx body into one ``Answer`` or ``NoAnswer`` per question asked.

    Args:
        payload: the decoded JSON body.
        request: the request it answers.
        engine: the engine name to stamp on answers and errors.
        latency_ms: the call's wall time.
        server_labels: derive ``Signals.agreement`` from ``diagnostics.samples.tops`` using the
            structured server's slot labels (``yes``/``no``, ``A``.., ``1``..``9`` for small scores).

    Raises:
        EngineProtocolError: the body is not an object with an ``answers`` object.
    """
    if not isinstance(payload, Mapping):
        raise EngineProtocolError(f"reply is not a JSON object: {str(payload)[:200]}", engine=engine)
    answers = payload.get("answers")
    if not isinstance(answers, Mapping):
        raise EngineProtocolError("reply has no 'answers' object", engine=engine)
    raw_model = payload.get("model")
    model = raw_model if isinstance(raw_model, str) and raw_model else request.model
    raw_diagnostics = payload.get("diagnostics")
    diagnostics: Mapping[str, Any] = raw_diagnostics if isinstance(raw_diagnostics, Mapping) else {}
    reads = reads_by_question(diagnostics)

    out: dict[str, Answer | NoAnswer] = {}
    for wire_name, wq in request.questions.items():
        kind = wq.question.kind
        if wire_name not in answers:
            probs_or_reason: dict[str, float] | str = "no answer returned for this question"
        else:
            probs_or_reason = _probabilities(answers[wire_name], wq.wire)
        if isinstance(probs_or_reason, dict):
            try:
                probs = normalise_distribution(wq.wire, probs_or_reason, engine=engine)
            except EngineProtocolError as exc:
                probs_or_reason = f"unusable distribution: {exc}"
        if isinstance(probs_or_reason, str):
            out[wq.name] = NoAnswer(
                question=wq.name, kind=kind, reason=probs_or_reason, engine=engine, model=model, latency_ms=latency_ms
            )
            continue
        signals = read_signals(wire_name, wq.wire, probs, diagnostics, reads, server_labels=server_labels)
        out[wq.name] = Answer(
            question=wq.name,
            kind=kind,
            probabilities=dict(zip(wq.question.options, probs.values(), strict=True)),
            engine=engine,
            model=model,
            latency_ms=latency_ms,
            signals=signals,
        )
    usage = _usage(payload.get("usage"))
    return EngineReply(answers=out, engine=engine, model=model, latency_ms=latency_ms, usage=usage)
