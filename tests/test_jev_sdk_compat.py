"""The verbatim replies we replay are real Jev replies: the official ``typesafe-sdk`` reads them too.

And the traps are real traps: the SDK rejects a ``null`` answer and a list ``legend``; we accept both.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr
from typesafe_sdk import AsyncTypeSafeClient, RetryPolicy
from typesafe_sdk._core.errors import TypeSafeAPIResponseValidationError

from fastslow.engines.jev import JevEngine
from fastslow.router import Answer, NoAnswer, Question
from fastslow.router.engine_api import question_to_wire
from fastslow.router.settings import JevSettings

from fakes.jev_replies import JEV_QUESTIONS, JEV_REQUEST, SDK_REJECTS, VALID
from fakes.jev_server import JevFakeServer, Reply, running_jev_server


def _sdk_questions(questions: dict[str, Question]) -> dict[str, Any]:
    return {name: question_to_wire(q) for name, q in questions.items()}


async def _both(server: JevFakeServer, reply: dict[str, Any], questions: dict[str, Question]) -> tuple[Any, Any]:
    """Ask the SDK and our engine the same questions, both answered with ``reply``."""
    server.script(Reply(200, reply), Reply(200, reply))
    sdk_result: Any
    async with AsyncTypeSafeClient(api_key="sk-test", base_url=server.url, retry=RetryPolicy(max_retries=0)) as sdk:
        try:
            sdk_result = await sdk.system_one("state", _sdk_questions(questions))
        except TypeSafeAPIResponseValidationError as exc:
            sdk_result = exc
    engine = JevEngine(JevSettings(base_url=server.url, profile="jev", api_key=SecretStr("sk-test")))
    try:
        ours = await engine.decide("state", questions)
    finally:
        await engine.aclose()
    return sdk_result, ours


@pytest.mark.parametrize("name", sorted(VALID))
async def test_valid_replies_parse_with_the_sdk_and_with_us(name: str) -> None:
    reply, questions = VALID[name]
    async with running_jev_server(None) as server:
        sdk, ours = await _both(server, reply, questions)
    assert not isinstance(sdk, Exception), sdk
    for question, answer in ours.answers.items():
        if question in sdk.answers:
            assert isinstance(answer, Answer)
        else:  # never answered, or a type the SDK drops (jev-compatible-server's "unsupported")
            assert isinstance(answer, NoAnswer)
    assert ours.model == sdk.model


@pytest.mark.parametrize("name", sorted(SDK_REJECTS))
async def test_trap_replies_break_the_sdk_but_not_us(name: str) -> None:
    reply, questions = SDK_REJECTS[name]
    async with running_jev_server(None) as server:
        sdk, ours = await _both(server, reply, questions)
    assert isinstance(sdk, TypeSafeAPIResponseValidationError)
    assert list(ours.answers) == list(questions)
    assert any(isinstance(a, Answer) for a in ours.answers.values())


async def test_we_send_what_the_sdk_sends() -> None:
    async with running_jev_server(None) as server:
        reply, _ = VALID["jev §1.3"]
        server.script(Reply(200, reply), Reply(200, reply))
        async with AsyncTypeSafeClient(api_key="sk-test", base_url=server.url) as sdk:
            await sdk.system_one(JEV_REQUEST["state"], _sdk_questions(JEV_QUESTIONS))
        engine = JevEngine(JevSettings(base_url=server.url, profile="jev", api_key=SecretStr("sk-test")))
        await engine.decide(JEV_REQUEST["state"], JEV_QUESTIONS)
        await engine.aclose()
    theirs, ours = server.requests
    assert theirs.json == ours.json == JEV_REQUEST
    assert theirs.path == ours.path == "/v1/systemone"
    assert theirs.headers["authorization"] == ours.headers["authorization"]
