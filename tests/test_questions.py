"""Typed questions: construction rules and the Jev wire form."""

from __future__ import annotations

import pytest

from fastslow.router import Choice, InvalidRequest, Noul, Score
from fastslow.router.engine_api import question_from_wire, question_to_wire, questions_from_wire, validate_state


def test_each_kind_names_its_options() -> None:
    assert Noul(instructions="Refund?").options == ("yes", "no")
    assert Choice(criteria={"billing": None, "technical": "Bugs"}).options == ("billing", "technical")
    assert Score(levels=["low", "mid", "high"]).options == ("0", "1", "2")


def test_a_noul_needs_instructions_or_a_described_outcome() -> None:
    with pytest.raises(InvalidRequest) as err:
        Noul()
    assert err.value.field == "instructions"
    assert Noul(yes="Asks for money back").options == ("yes", "no")


def test_choice_and_score_need_two_options() -> None:
    with pytest.raises(InvalidRequest, match="at least 2 options"):
        Choice(criteria={"only": None})
    with pytest.raises(InvalidRequest, match="at least 2 levels"):
        Score(levels=["one"])


def test_choice_copies_its_criteria() -> None:
    criteria: dict[str, str | None] = {"a": None, "b": None}
    question = Choice(criteria=criteria)
    criteria["c"] = None
    assert question.options == ("a", "b")


def test_wire_round_trip_matches_what_the_sdk_sends() -> None:
    # The request of wire-formats.md section 1.2, byte for byte.
    body = {
        "category": {
            "type": "choice",
            "instructions": "What is this ticket about?",
            "criteria": {"billing": None, "technical": "Bugs, outages", "other": None},
        },
        "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
        "refund_described": {"type": "noul", "criteria": {"true": "Asks for money back", "false": "Anything else"}},
        "urgency": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["Can wait", "This week", "Today"],
        },
    }
    parsed = questions_from_wire(body)
    assert {name: question_to_wire(q) for name, q in parsed.items()} == body


def test_structured_instructions_are_json_encoded() -> None:
    question = question_from_wire("q", {"type": "noul", "instructions": {"rule": "no refunds"}})
    assert question.instructions == '{"rule": "no refunds"}'


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"q": {"type": "box2"}}, "questions.q.type", "unknown question type"),
        ({"q": {"type": "choice", "criteria": {"a": None}}}, "questions.q.criteria", "at least 2"),
        ({"q": {"type": "choice", "criteria": {}}}, "questions.q.criteria", "at least 2"),
        ({"q": {"type": "choice"}}, "questions.q.criteria", "needs criteria"),
        ({"q": {"type": "score", "criteria": "low,high"}}, "questions.q.criteria", "list of levels"),
        ({"q": {"type": "noul"}}, "questions.q.instructions", "instructions or a described outcome"),
        (
            {"q": {"type": "noul", "instructions": "x", "criteria": {"maybe": "?"}}},
            "questions.q.criteria",
            "true/false",
        ),
        ({"q": "noul"}, "questions.q", "must be an object"),
        ({"a:b": {"type": "noul", "instructions": "x"}}, "questions.a:b", "without ':'"),
        ({}, "questions", "non-empty"),
    ],
)
def test_bad_questions_name_the_field(body: object, field: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        questions_from_wire(body)
    assert err.value.field == field
    assert message in str(err.value)


def test_state_must_be_json_and_bounded() -> None:
    assert validate_state({"ticket": "hi"}) == {"ticket": "hi"}
    with pytest.raises(InvalidRequest, match="string, object or array"):
        validate_state(42)
    with pytest.raises(InvalidRequest, match="limit is 10"):
        validate_state("x" * 11, max_chars=10)
    with pytest.raises(InvalidRequest, match="JSON-serialisable"):
        validate_state({"x": object()})
