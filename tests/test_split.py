"""Requests beyond an engine's limits are cut into ones it takes, and the answers merged."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import pytest

from fastslow.router import Answer, Choice, Image, InvalidRequest, NoAnswer, Noul, Question, ReadOptions, Score, State
from fastslow.router.engine_api import EngineLimits, EngineReply, Usage, split_and_ask


def _weight(option: str, question: Question) -> float:
    # Deterministic and order-independent: an option's weight does not depend on its group.
    text = question.criteria.get(option) if isinstance(question, Choice) else None
    digest = hashlib.sha256(f"{option}|{text}".encode()).digest()
    return 0.05 + digest[0] / 255.0


class LimitedServer:
    """Answers like a server with hard limits: anything beyond them is an error, as on the wire."""

    def __init__(self, limits: EngineLimits, refuse: frozenset[str] = frozenset()) -> None:
        self.limits = limits
        self.refuse = refuse
        self.requests: list[list[str]] = []

    async def ask(
        self, state: State, questions: Mapping[str, Question], images: Sequence[Image], options: ReadOptions
    ) -> EngineReply:
        del state, images, options
        self.requests.append(list(questions))
        assert self.limits.max_questions is None or len(questions) <= self.limits.max_questions
        answers: dict[str, Answer | NoAnswer] = {}
        for name, question in questions.items():
            assert self.limits.max_options is None or len(question.options) <= self.limits.max_options
            if any(option in self.refuse for option in question.options):
                answers[name] = NoAnswer(question=name, kind=question.kind, reason="refusal", engine="t", model="m")
                continue
            weights = {o: _weight(o, question) for o in question.options}
            total = sum(weights.values())
            answers[name] = Answer(
                question=name,
                kind=question.kind,
                probabilities={o: w / total for o, w in weights.items()},
                engine="t",
                model="m",
            )
        return EngineReply(answers=answers, engine="t", model="m", latency_ms=1.0, usage=Usage(input_tokens=10))


def _big_choice(n: int) -> Choice:
    return Choice(criteria={f"intent_{i}": f"description {i}" for i in range(n)}, instructions="Which intent?")


async def test_within_limits_is_one_request() -> None:
    server = LimitedServer(EngineLimits(max_questions=4, max_options=26))
    questions = {"a": Noul(instructions="x"), "b": _big_choice(5)}
    reply = await split_and_ask(server.ask, server.limits, "s", questions, engine="t")
    assert server.requests == [["a", "b"]]
    assert list(reply.answers) == ["a", "b"]


async def test_too_many_questions_are_chunked_and_usage_summed() -> None:
    server = LimitedServer(EngineLimits(max_questions=64))
    questions: dict[str, Question] = {f"q{i}": Noul(instructions=f"rule {i}") for i in range(150)}
    reply = await split_and_ask(server.ask, server.limits, "s", questions, engine="t")
    assert sorted(len(r) for r in server.requests) == [22, 64, 64]
    assert list(reply.answers) == list(questions)
    assert reply.usage.input_tokens == 30


async def test_a_77_way_choice_is_asked_in_groups_and_combined() -> None:
    server = LimitedServer(EngineLimits(max_options=26))
    question = _big_choice(77)
    reply = await split_and_ask(server.ask, server.limits, "s", {"intent": question}, engine="t")
    answer = reply.answers["intent"]
    assert isinstance(answer, Answer)
    assert list(answer.probabilities) == list(question.options)
    assert math.fsum(answer.probabilities.values()) == pytest.approx(1.0, abs=1e-6)
    # Stage 1: three balanced groups in one request; stage 2: their winners.
    assert sorted(server.requests[0]) == ["intent~g0", "intent~g1", "intent~g2"]
    assert server.requests[1] == ["intent"]
    # The favourite of the server's scoring wins overall: it wins its group, then the final.
    best = max(question.options, key=lambda o: _weight(o, question))
    assert answer.top == best


async def test_more_groups_than_options_recurse() -> None:
    server = LimitedServer(EngineLimits(max_options=3))
    question = _big_choice(20)
    reply = await split_and_ask(server.ask, server.limits, "s", {"q": question}, engine="t")
    answer = reply.answers["q"]
    assert isinstance(answer, Answer)
    assert len(answer.probabilities) == 20
    assert math.fsum(answer.probabilities.values()) == pytest.approx(1.0, abs=1e-6)


async def test_a_score_beyond_the_level_limit_keeps_its_level_keys() -> None:
    server = LimitedServer(EngineLimits(max_options=26, max_score_levels=10))
    question = Score(levels=[f"level {i}" for i in range(12)])
    reply = await split_and_ask(server.ask, server.limits, "s", {"s": question}, engine="t")
    answer = reply.answers["s"]
    assert isinstance(answer, Answer)
    assert answer.kind == "score"
    assert list(answer.probabilities) == [str(i) for i in range(12)]
    assert answer.expected is not None and 0 <= answer.expected <= 11


async def test_a_refused_group_makes_the_whole_question_no_answer() -> None:
    server = LimitedServer(EngineLimits(max_options=26), refuse=frozenset({"intent_70"}))
    reply = await split_and_ask(server.ask, server.limits, "s", {"intent": _big_choice(77)}, engine="t")
    answer = reply.answers["intent"]
    assert isinstance(answer, NoAnswer)
    assert answer.reason == "refusal"


async def test_images_need_an_engine_that_takes_them() -> None:
    server = LimitedServer(EngineLimits())
    with pytest.raises(InvalidRequest) as err:
        await split_and_ask(
            server.ask, server.limits, "s", {"a": Noul(instructions="x")}, images=[Image(data=b"\x89PNG")], engine="t"
        )
    assert err.value.field == "images"
    assert server.requests == []


async def test_a_two_option_limit_never_asks_a_single_option_question() -> None:
    server = LimitedServer(EngineLimits(max_options=2))
    question = _big_choice(5)
    reply = await split_and_ask(server.ask, server.limits, "s", {"q": question}, engine="t")
    answer = reply.answers["q"]
    assert isinstance(answer, Answer)
    assert math.fsum(answer.probabilities.values()) == pytest.approx(1.0, abs=1e-6)
    assert all(len(r) >= 1 for r in server.requests)
