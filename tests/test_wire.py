"""Jev request parsing and Jev-shaped replies (what `fastslow decide` and the gateway speak)."""

from __future__ import annotations

import json

import pytest

from fastslow.router import Answer, InvalidRequest, NoAnswer
from fastslow.router.engine_api import EngineReply, Usage, parse_systemone_request, render_systemone_reply

REQUEST = {
    "model": "jev-latest",
    "state": {"document": "I was charged twice. Please fix this ASAP."},
    "questions": {
        "category": {"type": "choice", "criteria": {"billing": None, "technical": "Bugs, outages", "other": None}},
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "urgency": {"type": "score", "instructions": "How urgent?", "criteria": ["Can wait", "This week", "Today"]},
    },
    "samples": 2,
    "think": 0,
}


def test_parse_reads_state_questions_and_extensions() -> None:
    request = parse_systemone_request(json.dumps(REQUEST))
    assert request.model == "jev-latest"
    assert list(request.questions) == ["category", "refund", "urgency"]
    assert request.options.samples == 2
    assert request.options.think == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{not json", "body"),
        ("[1, 2]", "body"),
        ('{"questions": {"q": {"type": "noul", "instructions": "x"}}}', "state"),
        ('{"state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}, "samples": 99}', "samples"),
        ('{"state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}, "think": -1}', "think"),
        ('{"state": "x", "questions": {"q": {"type": "noul", "instructions": "x"}}, "model": 3}', "model"),
    ],
)
def test_parse_errors_name_the_field(body: str, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_systemone_request(body)
    assert err.value.field == field


def test_render_matches_jev_response_shape() -> None:
    request = parse_systemone_request(REQUEST)
    reply = EngineReply(
        answers={
            "category": Answer(
                question="category",
                kind="choice",
                probabilities={"billing": 0.93, "technical": 0.04, "other": 0.03},
                engine="e",
                model="m",
            ),
            "refund": Answer(
                question="refund", kind="noul", probabilities={"yes": 0.97, "no": 0.03}, engine="e", model="m"
            ),
            "urgency": NoAnswer(question="urgency", kind="score", reason="refusal", engine="e", model="m"),
        },
        engine="e",
        model="m",
        latency_ms=3.0,
        usage=Usage(input_tokens=120, output_tokens=3),
    )
    body = render_systemone_reply(reply, request.questions)
    assert body["answers"]["category"] == {
        "type": "choice",
        "choice": "billing",
        "confidence": 0.93,
        "probabilities": {"billing": 0.93, "technical": 0.04, "other": 0.03},
    }
    assert body["answers"]["refund"] == {"type": "noul", "noul": 0.97}
    assert body["answers"]["urgency"] == {"type": "no_answer", "reason": "refusal"}
    assert body["usage"] == {"input_tokens": 120, "output_tokens": 3}


def test_render_score_has_legend_and_expected_value() -> None:
    request = parse_systemone_request(REQUEST)
    reply = EngineReply(
        answers={
            "urgency": Answer(
                question="urgency", kind="score", probabilities={"0": 0.1, "1": 0.1, "2": 0.8}, engine="e", model="m"
            )
        },
        engine="e",
        model="m",
        latency_ms=1.0,
    )
    body = render_systemone_reply(reply, {"urgency": request.questions["urgency"]})
    score = body["answers"]["urgency"]
    assert score["score"] == pytest.approx(1.7)
    assert score["legend"] == {"0": "Can wait", "1": "This week", "2": "Today"}
    assert score["confidence"] == pytest.approx(0.8)
