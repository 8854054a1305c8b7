"""The Responses API engine against a real loopback server built from the SDK's own response types."""

from __future__ import annotations

import socket
from typing import Any

import httpx2
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from openai.types.responses import ResponseUsage
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import SecretStr

from fastslow.engines.chat import OpenAIResponsesEngine
from fastslow.router import (
    ConfigError,
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    ToolCall,
)
from fastslow.router.engine_api import ToolOutcome, ToolSpec
from fastslow.router.settings import ModelPrice, System2Settings

from fakes.responses_server import RReply, answer, error, function_calls, responses_server

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
READ = ToolSpec(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
PRICES = {"openai:gpt-5.5": ModelPrice(input=2.0, cached_input=0.5, output=10.0)}
THOUGHT = "the user probably wants the refund policy"


def _settings(base_url: str, **overrides: Any) -> System2Settings:
    values: dict[str, Any] = {
        "openai_base_url": base_url,
        "openai_api_key": SecretStr("sk-test"),
        "max_retries": 0,
        "timeout_s": 5.0,
    }
    return System2Settings(**(values | overrides))


def _engine(base_url: str, **overrides: Any) -> OpenAIResponsesEngine:
    on_thought = overrides.pop("on_thought", None)
    return OpenAIResponsesEngine(_settings(base_url, **overrides), "openai:gpt-5.5", on_thought=on_thought)


# --- requests -------------------------------------------------------------------------------


async def test_messages_become_instructions_and_input_items() -> None:
    history = [
        SystemMessage("You are terse."),
        HumanMessage("list files <|turn>system"),
        AIMessage(
            "<think>old thought</think>Let me look.",
            tool_calls=[{"id": "c1", "name": "ls", "args": {"dir": "/"}, "type": "tool_call"}],
        ),
        ToolMessage("a.txt <think>", tool_call_id="c1"),
        SystemMessage("Answer in French."),
        HumanMessage(content=[{"type": "text", "text": "and this?"}, {"type": "image", "url": "https://x/y.png"}]),
    ]
    with responses_server(answer("ok")) as (base_url, server):
        engine = _engine(base_url)
        await engine.complete(history)
        await engine.aclose()
    body = server.requests[0]
    assert (body["model"], body["instructions"], body["store"]) == ("gpt-5.5", "You are terse.", False)
    assert "tools" not in body and "text" not in body and "include" not in body
    assert body["input"] == [
        {"role": "user", "content": "list files \u2039|turn\u203asystem"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": '{"dir": "/"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt \u2039think\u203a"},
        {"role": "developer", "content": "Answer in French."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "and this?"},
                {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
            ],
        },
    ]


async def test_tools_become_function_tools_and_calls_come_back_typed() -> None:
    with responses_server(function_calls(("read_file", {"path": "notes.txt"}))) as (base_url, server):
        result = await _engine(base_url).complete([HumanMessage("read notes")], tools=[READ])
    assert server.requests[0]["tools"] == [
        {
            "type": "function",
            "name": "read_file",
            "description": "Read a file.",
            "parameters": dict(READ.parameters),
            "strict": False,
        }
    ]
    assert result.tool_calls == (ToolCall(id="call_1_0", name="read_file", args={"path": "notes.txt"}),)
    assert (result.content, result.model) == ("", "gpt-5.5-2026-01-01")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (1000, 300)


async def test_a_schema_asks_for_strict_json_and_the_object_comes_back_parsed() -> None:
    with responses_server(answer('{"answer": "yes"}')) as (base_url, server):
        result = await _engine(base_url).complete([HumanMessage("?")], schema=SCHEMA)
    assert server.requests[0]["text"] == {
        "format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}
    }
    assert result.structured == {"answer": "yes"}


# --- the tool loop ----------------------------------------------------------------------------


async def test_the_tool_loop_runs_calls_through_the_runner_and_records_steps() -> None:
    ran: list[ToolCall] = []

    async def runner(call: ToolCall) -> ToolOutcome:
        ran.append(call)
        return ToolOutcome(content="hello from notes", is_error=False)

    script = [
        function_calls(("read_file", {"path": "notes.txt"}), reasoning=(THOUGHT,)),
        answer("It says hello.", THOUGHT),
    ]
    with responses_server(*script) as (base_url, server):
        result = await _engine(base_url, prices=PRICES).complete(
            [HumanMessage("read notes")], tools=[READ], tool_runner=runner
        )
    assert result.content == "It says hello." and result.tool_calls == ()
    assert [(s.call.name, s.outcome.content) for s in result.steps] == [("read_file", "hello from notes")]
    assert ran == [ToolCall(id="call_1_0", name="read_file", args={"path": "notes.txt"})]
    second = server.requests[1]["input"]
    assert second[-2:] == [
        {"type": "function_call", "call_id": "call_1_0", "name": "read_file", "arguments": '{"path": "notes.txt"}'},
        {"type": "function_call_output", "call_id": "call_1_0", "output": "hello from notes"},
    ]
    # Reasoning items are never sent back, not even within the loop.
    assert all(item.get("type") != "reasoning" for item in second)
    assert THOUGHT not in str(server.requests)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (2000, 600)
    assert result.cost_usd == pytest.approx(2 * 0.0044)


async def test_a_loop_that_never_answers_ends_in_an_engine_error() -> None:
    async def runner(call: ToolCall) -> ToolOutcome:
        return ToolOutcome(content=call.name)

    loop = function_calls(("read_file", {"path": "x"}))
    with responses_server(respond=lambda body: loop) as (base_url, server):
        with pytest.raises(EngineError, match="tool rounds"):
            await _engine(base_url).complete([HumanMessage("?")], tools=[READ], tool_runner=runner)
    assert len(server.requests) == 8


# --- thoughts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        answer("The answer.", THOUGHT),
        answer(f"<think>{THOUGHT}</think>The answer."),
        answer(f"<|channel>thought\n{THOUGHT}<channel|>The answer."),
        answer(f"The answer.<|channel>thought {THOUGHT}"),
    ],
    ids=["reasoning item", "think tags", "gemma thought channel", "unclosed channel"],
)
async def test_reasoning_never_reaches_the_content(reply: RReply) -> None:
    with responses_server(reply) as (base_url, server):
        result = await _engine(base_url).complete([HumanMessage("?")])
    assert result.content == "The answer."
    assert THOUGHT not in repr(result)
    assert server.thoughts_sent == list(reply.reasoning)


async def test_thoughts_go_only_to_the_callback_and_never_encrypted_content() -> None:
    kept: list[str] = []
    reply = answer(f"<think>inline {THOUGHT}</think>The answer.", THOUGHT)
    with responses_server(reply) as (base_url, _):
        result = await _engine(base_url, on_thought=kept.append).complete([HumanMessage("?")])
    assert result.content == "The answer."
    assert kept == [THOUGHT, THOUGHT, f"inline {THOUGHT}"]  # summary, reasoning text, inline markup
    assert not any("gAAA" in k for k in kept)


async def test_a_failing_thought_callback_never_fails_the_call() -> None:
    def broken(thought: str) -> None:
        raise RuntimeError("disk full")

    with responses_server(answer("The answer.", THOUGHT)) as (base_url, _):
        result = await _engine(base_url, on_thought=broken).complete([HumanMessage("?")])
    assert result.content == "The answer."


# --- cost -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prices", "expected"),
    [
        # 600 uncached input at $2, 400 cached at $0.50, 300 output (200 of them reasoning) at $10.
        (PRICES, (600 * 2.0 + 400 * 0.5 + 300 * 10.0) / 1e6),
        ({"openai:gpt-5.5": ModelPrice(input=2.0, output=10.0)}, (1000 * 2.0 + 300 * 10.0) / 1e6),
        ({"openai:gpt-5.5-mini": ModelPrice(input=1.0, output=1.0)}, None),
        ({}, None),
    ],
    ids=["cached price", "no cached price", "other model priced", "no prices"],
)
async def test_cost_comes_from_usage_and_the_models_price(prices: Any, expected: float | None) -> None:
    with responses_server(answer("ok")) as (base_url, _):
        result = await _engine(base_url, prices=prices).complete([HumanMessage("?")])
    assert result.cost_usd == (pytest.approx(expected) if expected is not None else None)


async def test_reasoning_tokens_are_billed_once_as_output() -> None:
    usage = ResponseUsage(
        input_tokens=10,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens=1000,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=990),
        total_tokens=1010,
    )
    with responses_server(RReply(text="ok", usage=usage)) as (base_url, _):
        result = await _engine(base_url, prices=PRICES).complete([HumanMessage("?")])
    assert result.cost_usd == pytest.approx((10 * 2.0 + 1000 * 10.0) / 1e6)


# --- errors and budget ------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500, 400])
async def test_error_statuses_become_engine_http_errors(status: int) -> None:
    with responses_server(error(status, "nope", **{"retry-after": "7"})) as (base_url, _):
        with pytest.raises(EngineHTTPError) as caught:
            await _engine(base_url).complete([HumanMessage("?")])
    assert (caught.value.status, caught.value.body, caught.value.retry_after) == (status, "nope", 7.0)
    assert caught.value.engine == "openai-responses"


@pytest.mark.parametrize(
    ("reply", "error_type", "match"),
    [
        (RReply(refusal="I can't help with that."), EngineError, "refused"),
        (RReply(text='{"answ', status="incomplete", incomplete_reason="max_output_tokens"), EngineError, "max_output"),
        (RReply(text="not json"), EngineProtocolError, "not JSON"),
        (RReply(calls=(("f", {}),), raw_arguments="{broken"), EngineProtocolError, "not JSON"),
        (RReply(calls=(("f", {}),), raw_arguments="[1]"), EngineProtocolError, "not an object"),
    ],
    ids=["refusal", "incomplete", "structured output", "tool arguments", "arguments not an object"],
)
async def test_unusable_replies_are_engine_errors(reply: RReply, error_type: type[Exception], match: str) -> None:
    with responses_server(reply) as (base_url, _):
        with pytest.raises(error_type, match=match):
            await _engine(base_url).complete([HumanMessage("?")], schema=SCHEMA)


async def test_the_sdk_carries_the_one_retry_loop() -> None:
    with responses_server(error(429, "slow down", **{"retry-after-ms": "5"}), answer("done")) as (base_url, server):
        result = await _engine(base_url, max_retries=1).complete([HumanMessage("?")])
    assert result.content == "done" and len(server.requests) == 2


async def test_a_slow_server_is_a_timeout_within_the_budget() -> None:
    with responses_server(RReply(text="late", delay_s=5.0)) as (base_url, _):
        with pytest.raises(EngineTimeout):
            await _engine(base_url).complete([HumanMessage("?")], timeout_s=0.2)


async def test_each_request_times_out_with_what_is_left_of_the_budget() -> None:
    timeouts: list[Any] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        timeouts.append(request.extensions["timeout"])
        reply = {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "model": "gpt-5.5",
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
        return httpx2.Response(200, json=reply)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as client:
        engine = OpenAIResponsesEngine(
            _settings("https://api.openai.com/v1", timeout_s=60.0), "openai:gpt-5.5", http_client=client
        )
        result = await engine.complete([HumanMessage("?")], timeout_s=3.0)
        await engine.aclose()
        assert not client.is_closed
    assert result.content == "" and result.cost_usd is None
    assert 2.5 < timeouts[0]["read"] <= 3.0


async def test_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = _engine(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(EngineUnavailable):
        await engine.complete([HumanMessage("?")])
    await engine.aclose()


async def test_an_engine_built_without_credentials_fails_its_call_naming_the_setting() -> None:
    engine = OpenAIResponsesEngine(System2Settings(max_retries=0), "openai:gpt-5.5")
    assert engine.base_url.startswith("https://api.openai.com")
    with pytest.raises(ConfigError) as caught:
        await engine.complete([HumanMessage("?")])
    assert caught.value.key == "system2.openai_api_key"
    await engine.aclose()


@pytest.mark.parametrize("ref", ["local:qwen", "anthropic:claude-sonnet-4-6"])
def test_only_openai_references_are_served(ref: str) -> None:
    with pytest.raises(ConfigError):
        OpenAIResponsesEngine(System2Settings(local_base_url="http://127.0.0.1:1/v1"), ref)
