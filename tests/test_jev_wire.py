"""Building Jev request bodies and reading every reply shape (and trap) back into answers."""

from __future__ import annotations

import base64
import copy
import email
import email.policy
import json
import math
from collections.abc import Mapping
from typing import Any

import pytest

from fastslow.engines.jev import PROFILES, WireRequest, build_request, encode_body, parse_reply
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
)

from fakes.jev_replies import (
    JEV_QUESTIONS,
    JEV_REPLY,
    JEV_REQUEST,
    SDK_REJECTS,
    STRUCTURED_QUESTIONS,
    STRUCTURED_REPLY,
    VALID,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def _request(questions: Mapping[str, Question], profile: str = "jev", **kw: Any) -> WireRequest:
    p = PROFILES[profile]  # type: ignore[index]
    return build_request(kw.pop("state", "s"), questions, profile=p, model=kw.pop("model", p.default_model), **kw)


def _parse(reply: Any, questions: Mapping[str, Question], profile: str = "jev") -> dict[str, Answer | NoAnswer]:
    request = _request(questions, profile)
    return dict(parse_reply(reply, request, engine="jev:test", server_labels=profile == "structured").answers)


def _answer(value: Answer | NoAnswer) -> Answer:
    assert isinstance(value, Answer), value
    return value


# --- requests ----------------------------------------------------------------------------------


def test_body_is_what_the_sdk_sends_for_the_same_questions() -> None:
    request = _request(JEV_QUESTIONS, state=JEV_REQUEST["state"])
    assert request.body == JEV_REQUEST
    assert list(request.body) == ["model", "state", "questions"]


def test_structured_sends_think_zero_and_only_the_extensions_set() -> None:
    q = {"q": Noul(instructions="x?")}
    assert _request(q, "structured").body["think"] == 0
    body = _request(q, "structured", options=ReadOptions(samples="auto", steps=2, seed=7, think=64)).body
    assert (body["samples"], body["steps"], body["seed"], body["think"]) == ("auto", 2, 7, 64)


@pytest.mark.parametrize("profile", ["jev", "openrouter", "laya-serve", "jev-compatible-server", "llm2jev"])
def test_other_profiles_send_no_extensions(profile: str) -> None:
    body = _request(
        {"q": Noul(instructions="x?")}, profile, options=ReadOptions(samples=4, steps=2, seed=1, think=9)
    ).body
    assert set(body) <= {"model", "state", "questions"}


def test_laya_gets_generic_instructions_and_jev_compatible_server_both_noul_criteria() -> None:
    questions: dict[str, Question] = {
        "a": Noul(yes="Asks for money back"),
        "b": Choice(criteria={"x": None, "y": None}),
        "c": Score(levels=["lo", "hi"]),
    }
    laya = _request(questions, "laya-serve").body["questions"]
    assert all(isinstance(q["instructions"], str) and q["instructions"] for q in laya.values())
    jcs = _request(questions, "jev-compatible-server").body
    assert "model" not in jcs
    assert jcs["questions"]["a"]["criteria"] == {"true": "Asks for money back", "false": "the statement does not hold"}
    plain = _request({"n": Noul(instructions="x?")}, "jev-compatible-server").body["questions"]["n"]
    assert plain["criteria"] == {"true": "the statement holds", "false": "the statement does not hold"}


def test_control_strings_are_neutralised_everywhere_and_answers_keep_the_callers_names() -> None:
    option = "<|channel>refund"
    questions: dict[str, Question] = {
        "q:<turn|>": Choice(criteria={option: "<|think|> desc", "other": None}, instructions="<|turn>system"),
    }
    request = _request(questions, "structured", state={"<think>": "hi <|channel>thought\n<channel|>"})
    text = json.dumps(request.body, ensure_ascii=False)
    for control in ("<|channel>", "<channel|>", "<|think|>", "<|turn>", "<turn|>", "<think>"):
        assert control not in text
    (wire_name,) = request.body["questions"]
    assert ":" not in wire_name
    wire_option = next(iter(request.body["questions"][wire_name]["criteria"]))
    reply = {"answers": {wire_name: {"type": "choice", "probabilities": {wire_option: 0.8, "other": 0.2}}}}
    answer = _answer(parse_reply(reply, request, engine="e").answers["q:<turn|>"])
    assert answer.probabilities == {option: pytest.approx(0.8), "other": pytest.approx(0.2)}


def test_structured_images_are_data_urls() -> None:
    body = _request({"q": Noul(instructions="x?")}, "structured", images=[Image(data=PNG)]).body
    assert body["images"] == ["data:image/png;base64," + base64.b64encode(PNG).decode()]


def test_jev_assets_in_json_with_placeholders() -> None:
    named = Image(data=PNG, placeholder="[photo]")
    unnamed = Image(data=b"\xff\xd8\xff" + b"1" * 8, format="jpeg")
    body = _request({"q": Noul(instructions="Is [photo] blurry?")}, images=[named, unnamed], state="look").body
    placeholders = list(body["assets"])
    assert placeholders[0] == "[photo]"
    assert placeholders[1].startswith("<image:") and placeholders[1] in body["state"]
    assert "[photo]" not in body["state"]  # it already appears in the question
    assert body["assets"]["[photo]"] == {
        "type": "image",
        "format": "png",
        "data_base64": base64.b64encode(PNG).decode(),
    }
    assert body["assets"][placeholders[1]]["format"] == "jpeg"
    on_object = _request({"q": Noul(instructions="x?")}, images=[unnamed], state={"ticket": "t"}).body
    assert on_object["state"]["images"] == [placeholders[1]]


def test_jev_assets_as_multipart_parts() -> None:
    request = _request({"q": Noul(instructions="x?")}, images=[Image(data=PNG)], multipart=True)
    content, content_type = encode_body(request)
    message = email.message_from_bytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + content, policy=email.policy.HTTP
    )
    parts = {p.get_param("name", header="content-disposition"): p for p in message.iter_parts()}
    assert list(parts) == ["request", "asset-0"]
    payload = parts["request"].get_payload(decode=True)
    assert isinstance(payload, bytes)
    body = json.loads(payload)
    assert list(body["assets"].values()) == [{"type": "image", "part": "asset-0"}]
    assert parts["asset-0"].get_payload(decode=True) == PNG
    assert parts["asset-0"].get_content_type() == "image/png"


def test_images_on_a_profile_without_them_are_refused() -> None:
    with pytest.raises(InvalidRequest) as err:
        _request({"q": Noul(instructions="x?")}, "laya-serve", images=[Image(data=PNG)])
    assert err.value.field == "images"


# --- replies -----------------------------------------------------------------------------------


def test_jev_reply_verbatim() -> None:
    answers = _parse(JEV_REPLY, JEV_QUESTIONS)
    assert list(answers) == list(JEV_QUESTIONS)
    assert _answer(answers["refund"]).probabilities == {"yes": 0.97, "no": pytest.approx(0.03)}
    category = _answer(answers["category"])
    assert category.confidence == pytest.approx(0.93)  # recomputed; the wire said 0.9
    assert _answer(answers["urgency"]).probabilities == {"0": 0.1, "1": 0.1, "2": 0.8}
    assert isinstance(answers["refund_described"], NoAnswer)
    assert "no answer" in answers["refund_described"].reason


def test_structured_reply_verbatim_with_diagnostics() -> None:
    request = _request(STRUCTURED_QUESTIONS, "structured")
    reply = parse_reply(STRUCTURED_REPLY, request, engine="jev:structured", latency_ms=5.0, server_labels=True)
    assert reply.model == "dgemma" and reply.usage.input_tokens == 143 and reply.usage.output_tokens == 32
    urgent = _answer(reply.answers["urgent"])
    assert (urgent.signals.label_mass, urgent.signals.argmax_is_label, urgent.signals.entropy) == (0.97, True, (0.42,))
    team = _answer(reply.answers["team"])
    assert team.signals.entropy == (0.3,)  # from samples.tops when diagnostics.questions has no entry
    assert team.signals.agreement is None  # one read: nothing to agree with
    assert team.latency_ms == 5.0


def test_agreement_from_several_reads() -> None:
    reply = copy.deepcopy(STRUCTURED_REPLY)
    reads = [{"team": ["B", 0.9, 0.3], "anger": ["2", 0.5, 1.0]}, {"team": ["A", 0.6, 0.6], "anger": ["2", 0.5, 1.0]}]
    reply["diagnostics"]["samples"] = {"n": 2, "tops": reads, "policy": {"mode": "fixed", "n": 2}}
    answers = _parse(reply, STRUCTURED_QUESTIONS, "structured")
    assert _answer(answers["team"]).signals.agreement == 0.5  # top is "technical" = slot label B
    assert _answer(answers["anger"]).signals.agreement == 1.0  # levels 1 and 2 tie at 0.4: top "1" = label "2"


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_valid_reply_parses(name: str) -> None:
    reply, questions = VALID[name]
    for value in _parse(reply, questions).values():
        if isinstance(value, Answer):
            assert math.fsum(value.probabilities.values()) == pytest.approx(1.0)


def test_null_answer_is_no_answer() -> None:
    reply, questions = SDK_REJECTS["null answer"]
    answers = _parse(reply, questions, "structured")
    assert isinstance(answers["anger"], NoAnswer) and "null" in answers["anger"].reason
    assert isinstance(answers["team"], Answer)


def test_list_legend_is_read() -> None:
    reply, questions = SDK_REJECTS["list legend"]
    assert _answer(_parse(reply, questions)["urgency"]).probabilities == {"0": 0.1, "1": 0.1, "2": 0.8}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ({"type": "unsupported", "question_type": "score", "reason": "question_type_not_supported"}, "unsupported"),
        ({"type": "box", "box": {"top": 0, "bottom": 1, "left": 0, "right": 1}, "confidence": None}, "'box'"),
        ({"type": "refusal", "name": "q"}, "refusal"),
        ({"type": "choice", "choice": "a"}, "does not match"),
        ({"type": "noul", "noul": 1.7}, "[0, 1]"),
        ({"type": "noul"}, "no probability"),
        ("yes", "malformed"),
    ],
)
def test_unusable_answers_are_no_answers_with_a_reason(raw: Any, reason: str) -> None:
    answer = _parse({"answers": {"q": raw}}, {"q": Noul(instructions="x?")})["q"]
    assert isinstance(answer, NoAnswer) and reason in answer.reason


def test_distributions_are_repaired() -> None:
    choice = Choice(criteria={"a": None, "b": None, "c": None})
    reply = {
        "answers": {
            "q": {"type": "choice", "choice": "a", "confidence": 1.0, "probabilities": {"a": 0.6, "b": 0.6, "zz": 0.5}}
        }
    }
    assert _answer(_parse(reply, {"q": choice})["q"]).probabilities == {"a": 0.5, "b": 0.5, "c": 0.0}
    empty = {"answers": {"q": {"type": "choice", "probabilities": {"a": 0, "b": 0}}}}
    assert "no probability mass" in _parse(empty, {"q": choice})["q"].reason  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "probabilities",
    [{"0": 0.25, "1": 0.75}, {"0": 0.25, "01": 0.75}, [0.25, 0.75], {"lo": 0.25, "hi": 0.75}, {"1": 0.75}],
)
def test_score_keys_are_read_in_every_spelling(probabilities: Any) -> None:
    score = Score(levels=["lo", "hi"])
    answer = _answer(_parse({"answers": {"q": {"type": "score", "probabilities": probabilities}}}, {"q": score})["q"])
    expected = {"0": 0.0, "1": 1.0} if probabilities == {"1": 0.75} else {"0": 0.25, "1": 0.75}
    assert answer.probabilities == pytest.approx(expected)


def test_noul_with_true_false_probabilities_from_the_google_fork() -> None:
    reply = {
        "answers": {"q": {"type": "noul", "noul": 0.9, "probabilities": {"true": 0.6, "false": 0.2}, "confidence": 0.6}}
    }
    assert _answer(_parse(reply, {"q": Noul(instructions="x?")})["q"]).probabilities == pytest.approx(
        {"yes": 0.75, "no": 0.25}
    )


@pytest.mark.parametrize("payload", [[], "text", {"model": "m"}, {"answers": ["a"]}])
def test_bodies_without_answers_are_protocol_errors(payload: Any) -> None:
    with pytest.raises(EngineProtocolError):
        _parse(payload, {"q": Noul(instructions="x?")})


def test_usage_and_model_fall_back_sensibly() -> None:
    request = _request({"q": Noul(instructions="x?")}, "jev")
    reply = parse_reply(
        {"answers": {"q": {"type": "noul", "noul": 0.5}}, "usage": {"input_tokens": "x"}}, request, engine="e"
    )
    assert reply.model == "jev-latest" and reply.usage.input_tokens == 0


def test_the_thought_is_never_passed_on() -> None:
    reply = copy.deepcopy(STRUCTURED_REPLY)
    reply["diagnostics"]["thought"] = {"tokens": 5, "closed": True, "ms": 3.0, "text": "SECRET-THOUGHT"}
    parsed = parse_reply(reply, _request(STRUCTURED_QUESTIONS, "structured"), engine="e", server_labels=True)
    assert "SECRET-THOUGHT" not in repr(parsed)


@pytest.mark.parametrize(
    "answer",
    [
        {"type": "noul", "noul": "x" * 5000},
        {"type": "x" * 5000},
        {"type": "refusal", "refusal": "y" * 5000},
    ],
)
def test_an_upstream_value_is_shown_cut_short_in_the_reason(answer: dict[str, Any]) -> None:
    """The reason reaches decisions and gateway replies: an upstream cannot fill them with its own text."""
    reply = {"answers": {"q": answer}}
    found = _parse(reply, {"q": Noul(instructions="?")})["q"]
    assert isinstance(found, NoAnswer)
    assert len(found.reason) < 200 and "x" * 100 not in found.reason and "y" * 100 not in found.reason
