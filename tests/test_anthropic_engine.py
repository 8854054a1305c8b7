"""The Anthropic System-2 engine, through the official SDK, against a real loopback server."""

from __future__ import annotations

import json
import logging
import socket
from typing import Any

import httpx2
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from pydantic import SecretStr

from fastslow.engines.chat._anthropic import MAX_TOOL_ROUNDS, AnthropicChatEngine
from fastslow.router import (
    ConfigError,
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    ToolCall,
)
from fastslow.router.engine_api import ChatEngine, ToolOutcome, ToolSpec, ToolStep
from fastslow.router.settings import ModelPrice, System2Settings

from fakes.anthropic_server import Reply, answer, anthropic_server, error, refusal, text, tool_use

REF = "anthropic:claude-sonnet-4-6"
CANARY = "CANARY-7f3e-thinking"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
LOOKUP = ToolSpec(
    name="lookup",
    description="Find an order.",
    parameters={"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]},
)


def _settings(base_url: str | None, **overrides: Any) -> System2Settings:
    values: dict[str, Any] = {
        "anthropic_base_url": base_url,
        "anthropic_api_key": SecretStr("sk-ant-test"),
        "max_retries": 0,
        "timeout_s": 5.0,
    }
    return System2Settings(**(values | overrides))


def _engine(base_url: str | None, *, settings: System2Settings | None = None, **kwargs: Any) -> AnthropicChatEngine:
    return AnthropicChatEngine(settings or _settings(base_url), REF, **kwargs)


class Runner:
    """A tool runner that records its calls and answers from a table; names in ``denied`` are refused."""

    def __init__(self, *, denied: tuple[str, ...] = ()) -> None:
        self.calls: list[ToolCall] = []
        self.denied = denied

    async def __call__(self, call: ToolCall) -> ToolOutcome:
        self.calls.append(call)
        if call.name in self.denied:
            return ToolOutcome(content="denied by policy: refunds need review", is_error=True)
        return ToolOutcome(content=f"order {call.args.get('order')} shipped")


# --- construction --------------------------------------------------------------------------


async def test_the_engine_is_a_chat_engine_with_a_read_only_base_url() -> None:
    engine = _engine("http://127.0.0.1:9")
    assert isinstance(engine, ChatEngine)
    assert (engine.name, engine.model) == ("anthropic-chat", "claude-sonnet-4-6")
    assert engine.base_url.startswith("http://127.0.0.1:9")
    with pytest.raises(AttributeError):
        engine.base_url = "http://elsewhere"  # type: ignore[misc]
    await engine.aclose()


@pytest.mark.parametrize(
    ("ref", "kwargs"),
    [("openai:gpt-5.5", {}), ("claude-sonnet-4-6", {}), (REF, {"thinking_budget": 512})],
)
def test_bad_references_and_thinking_budgets_are_config_errors(ref: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        AnthropicChatEngine(_settings(None), ref, **kwargs)


async def test_without_key_or_base_url_the_engine_builds_but_a_call_names_the_setting() -> None:
    engine = AnthropicChatEngine(System2Settings(), REF)
    with pytest.raises(ConfigError) as caught:
        await engine.complete([HumanMessage("hi")])
    assert caught.value.key == "system2.anthropic_api_key"
    await engine.aclose()


async def test_the_sdk_reads_anthropic_base_url_and_api_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with anthropic_server(text("from env")) as (base_url, server):
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
        engine = AnthropicChatEngine(System2Settings(max_retries=0), REF)
        assert engine.base_url.startswith(base_url)
        result = await engine.complete([HumanMessage("hi")])
        await engine.aclose()
    assert result.content == "from env"
    sent = server.headers[0]
    assert "sk-ant-from-env" in sent.get("x-api-key", "") + sent.get("authorization", "")


async def test_requests_go_through_a_given_http_client_which_the_engine_leaves_open() -> None:
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(str(request.url))
        reply = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-6",
            "content": [{"type": "text", "text": "mocked"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 1},
        }
        return httpx2.Response(200, json=reply)

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler)) as client:
        engine = _engine("https://anthropic.example", http_client=client)
        result = await engine.complete([HumanMessage("hi")])
        await engine.aclose()
        assert not client.is_closed
    assert result.content == "mocked"
    assert seen == ["https://anthropic.example/v1/messages"]


# --- conversion ----------------------------------------------------------------------------


async def test_langchain_history_becomes_alternating_anthropic_turns_without_any_thinking() -> None:
    history = [
        SystemMessage("You are terse."),
        HumanMessage("where is order 7?"),
        AIMessage(
            content=[
                {"type": "thinking", "thinking": f"old thought {CANARY}", "signature": f"sig {CANARY}"},
                {"type": "text", "text": "Let me check."},
            ],
            tool_calls=[{"id": "t1", "name": "lookup", "args": {"order": "7"}, "type": "tool_call"}],
        ),
        ToolMessage("shipped", tool_call_id="t1"),
        HumanMessage(content=[{"type": "text", "text": "and this?"}, {"type": "image", "url": "https://x/y.png"}]),
        SystemMessage("Answer in English."),
        AIMessage(""),  # an empty turn is left out
        HumanMessage(
            content=[{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,QUJD"}}, "thanks"],
        ),
    ]
    with anthropic_server(text("ok")) as (base_url, server):
        engine = _engine(base_url)
        await engine.complete(history)
        await engine.aclose()
    body = server.requests[0]
    assert CANARY not in json.dumps(body)
    assert body["system"] == "You are terse.\n\nAnswer in English."
    assert body["model"] == "claude-sonnet-4-6"
    assert "thinking" not in body and "tools" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "where is order 7?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"order": "7"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "shipped"},
                {"type": "text", "text": "and this?"},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}},
                {"type": "text", "text": "thanks"},
            ],
        },
    ]


# --- structured output ---------------------------------------------------------------------


async def test_a_schema_becomes_a_forced_answer_tool_whose_input_is_the_structured_value() -> None:
    with anthropic_server(answer({"answer": "yes"})) as (base_url, server):
        engine = _engine(base_url)
        result = await engine.complete([HumanMessage("ship it?")], schema=SCHEMA)
        await engine.aclose()
    assert result.structured == {"answer": "yes"}
    assert json.loads(result.content) == {"answer": "yes"}
    assert result.tool_calls == ()
    body = server.requests[0]
    assert body["tools"] == [{"name": "answer", "description": body["tools"][0]["description"], "input_schema": SCHEMA}]
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}


async def test_a_schema_call_turns_thinking_off_because_a_forced_tool_forbids_it() -> None:
    with anthropic_server(answer({"answer": "no"})) as (base_url, server):
        engine = _engine(base_url, thinking_budget=2048)
        result = await engine.complete([HumanMessage("ship it?")], schema=SCHEMA)
        await engine.aclose()
    assert result.structured == {"answer": "no"}
    assert server.requests[0]["thinking"] == {"type": "disabled"}
    assert server.requests[0]["max_tokens"] == 4096


async def test_with_tools_and_a_schema_the_model_may_use_the_tools_before_answering() -> None:
    runner = Runner()
    script = (tool_use(("lookup", {"order": "7"})), answer({"answer": "yes"}))
    with anthropic_server(*script) as (base_url, server):
        engine = _engine(base_url)
        result = await engine.complete([HumanMessage("shipped?")], tools=[LOOKUP], schema=SCHEMA, tool_runner=runner)
        await engine.aclose()
    assert result.structured == {"answer": "yes"}
    assert [step.call.name for step in result.steps] == ["lookup"]
    assert server.requests[0]["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert [t["name"] for t in server.requests[0]["tools"]] == ["lookup", "answer"]


async def test_a_schema_reply_without_the_answer_tool_is_a_protocol_error() -> None:
    with anthropic_server(text("yes")) as (base_url, _):
        engine = _engine(base_url)
        with pytest.raises(EngineProtocolError):
            await engine.complete([HumanMessage("ship it?")], schema=SCHEMA)
        await engine.aclose()


async def test_a_caller_tool_may_not_take_the_answer_tools_name() -> None:
    engine = _engine("http://127.0.0.1:9")
    with pytest.raises(ConfigError):
        await engine.complete([HumanMessage("hi")], tools=[ToolSpec(name="answer")], schema=SCHEMA)
    await engine.aclose()


# --- the tool loop -------------------------------------------------------------------------


async def test_the_tool_loop_sends_signed_thinking_back_verbatim_and_returns_none_of_it() -> None:
    thoughts: list[str] = []
    runner = Runner()
    script = (
        tool_use(("lookup", {"order": "7"}), text="Checking.", thinking=("plan", "recheck"), redacted=("opaque",)),
        text("Order 7 shipped."),
    )
    with anthropic_server(*script, canary=CANARY) as (base_url, server):
        engine = _engine(base_url, thinking_budget=2048, on_thought=thoughts.append)
        result = await engine.complete([HumanMessage("where is order 7?")], tools=[LOOKUP], tool_runner=runner)
        await engine.aclose()

    first, second = server.requests
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert first["max_tokens"] == 4096 + 2048
    assert first["tools"] == [
        {"name": "lookup", "description": "Find an order.", "input_schema": dict(LOOKUP.parameters)}
    ]
    assert second["messages"][0] == first["messages"][0]
    assert second["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": f"plan {CANARY}", "signature": f"sig-1-0 {CANARY}"},
            {"type": "thinking", "thinking": f"recheck {CANARY}", "signature": f"sig-1-1 {CANARY}"},
            {"type": "redacted_thinking", "data": f"opaque {CANARY}"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1_0", "name": "lookup", "input": {"order": "7"}},
        ],
    }
    assert second["messages"][2] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1_0", "content": "order 7 shipped"}],
    }

    assert runner.calls == [ToolCall(id="toolu_1_0", name="lookup", args={"order": "7"})]
    assert result.content == "Order 7 shipped."
    assert result.steps == (ToolStep(call=runner.calls[0], outcome=ToolOutcome(content="order 7 shipped")),)
    assert result.tool_calls == ()
    assert CANARY not in repr(result)
    # The debug sink saw the readable thoughts of both rounds, never the redacted payloads.
    assert thoughts == [f"plan {CANARY}", f"recheck {CANARY}", f"thinking {CANARY}"]


async def test_a_denied_tool_goes_back_as_an_error_tool_result() -> None:
    runner = Runner(denied=("refund",))
    refund = ToolSpec(name="refund")
    with anthropic_server(tool_use(("refund", {"order": "7"})), text("I cannot refund that.")) as (base_url, server):
        engine = _engine(base_url)
        result = await engine.complete([HumanMessage("refund 7")], tools=[refund], tool_runner=runner)
        await engine.aclose()
    assert server.requests[1]["messages"][-1]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1_0",
            "content": "denied by policy: refunds need review",
            "is_error": True,
        }
    ]
    assert result.steps[0].outcome.is_error
    assert result.content == "I cannot refund that."


async def test_replaying_a_finished_loop_in_a_new_call_never_sends_thinking() -> None:
    with anthropic_server(
        tool_use(("lookup", {"order": "7"})), text("Shipped."), text("You're welcome."), canary=CANARY
    ) as (
        base_url,
        server,
    ):
        engine = _engine(base_url, thinking_budget=1024)
        question = HumanMessage("where is order 7?")
        first = await engine.complete([question], tools=[LOOKUP], tool_runner=Runner())
        # Only final content is stored, so that is all a later turn can replay.
        history = [question, AIMessage(first.content), HumanMessage("thanks")]
        await engine.complete(history, tools=[LOOKUP], tool_runner=Runner())
        await engine.aclose()
    assert CANARY in json.dumps(server.requests[1])  # within the loop: sent back
    assert CANARY not in json.dumps(server.requests[2])  # a new call: never


async def test_without_a_runner_tool_calls_are_returned_to_the_caller() -> None:
    with anthropic_server(tool_use(("lookup", {"order": "7"}), text="Let me look.")) as (base_url, server):
        engine = _engine(base_url)
        result = await engine.complete([HumanMessage("where is 7?")], tools=[LOOKUP])
        await engine.aclose()
    assert result.tool_calls == (ToolCall(id="toolu_1_0", name="lookup", args={"order": "7"}),)
    assert result.content == "Let me look."
    assert len(server.requests) == 1


async def test_thinking_with_tools_but_no_runner_is_a_config_error() -> None:
    engine = _engine("http://127.0.0.1:9", thinking_budget=1024)
    with pytest.raises(ConfigError, match="tool_runner"):
        await engine.complete([HumanMessage("hi")], tools=[LOOKUP])
    await engine.aclose()


async def test_a_loop_that_never_ends_stops_after_the_maximum_rounds() -> None:
    with anthropic_server(respond=lambda body: tool_use(("lookup", {"order": "7"}))) as (base_url, server):
        engine = _engine(base_url)
        with pytest.raises(EngineError, match="tool rounds"):
            await engine.complete([HumanMessage("loop")], tools=[LOOKUP], tool_runner=Runner())
        await engine.aclose()
    assert len(server.requests) == MAX_TOOL_ROUNDS


async def test_a_failing_thought_sink_is_logged_and_the_call_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    def broken(thought: str) -> None:
        raise OSError("disk full")

    with anthropic_server(text("fine", thinking=("hmm",))) as (base_url, _):
        engine = _engine(base_url, thinking_budget=1024, on_thought=broken)
        with caplog.at_level(logging.WARNING):
            result = await engine.complete([HumanMessage("hi")])
        await engine.aclose()
    assert result.content == "fine"
    assert "thought sink failed" in caplog.text


async def test_inline_thought_markers_are_cut_from_the_content() -> None:
    with anthropic_server(text("<think>secret</think>The answer.")) as (base_url, _):
        engine = _engine(base_url)
        result = await engine.complete([HumanMessage("hi")])
        await engine.aclose()
    assert result.content == "The answer."


# --- usage and cost ------------------------------------------------------------------------


async def test_usage_and_cost_add_up_over_rounds_and_price_cache_reads_and_writes() -> None:
    prices = {REF: ModelPrice(input=3.0, output=15.0, cached_input=0.3)}
    first = Reply(calls=(("lookup", {"order": "7"}),), input_tokens=100, output_tokens=20, cache_write=1000)
    second = Reply(text="done", input_tokens=50, output_tokens=10, cache_read=1000, cache_write=200, cache_write_1h=200)
    with anthropic_server(first, second) as (base_url, _):
        engine = _engine(base_url, settings=_settings(base_url, prices=prices))
        result = await engine.complete([HumanMessage("hi")], tools=[LOOKUP], tool_runner=Runner())
        await engine.aclose()
    assert (result.usage.input_tokens, result.usage.output_tokens) == (100 + 1000 + 50 + 1000 + 200, 30)
    expected = (
        150 * 3.0  # uncached input
        + 1000 * 0.3  # cache read
        + 1000 * 3.0 * 1.25  # 5-minute cache write
        + 200 * 3.0 * 2.0  # 1-hour cache write
        + 30 * 15.0  # output
    ) / 1_000_000
    assert result.cost_usd == pytest.approx(expected)


async def test_an_unpriced_model_records_no_cost() -> None:
    with anthropic_server(text("hi")) as (base_url, _):
        engine = _engine(base_url)
        result = await engine.complete([HumanMessage("hi")])
        await engine.aclose()
    assert result.cost_usd is None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (11, 7)


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "status", "retry_after"),
    [
        (error(429, "slow down", retry_after="3"), 429, 3.0),
        (error(429, "slow down", retry_after_ms="1500"), 429, 1.5),
        (error(529, "Overloaded"), 529, None),
        (error(500, "boom"), 500, None),
        (error(400, "bad request"), 400, None),
    ],
)
async def test_error_statuses_become_engine_http_errors(reply: Reply, status: int, retry_after: float | None) -> None:
    with anthropic_server(reply) as (base_url, _):
        engine = _engine(base_url)
        with pytest.raises(EngineHTTPError) as caught:
            await engine.complete([HumanMessage("hi")])
        await engine.aclose()
    assert (caught.value.status, caught.value.body, caught.value.retry_after) == (status, reply.message, retry_after)
    assert caught.value.engine == "anthropic-chat"


async def test_the_sdk_retries_an_overloaded_server_within_the_budget() -> None:
    with anthropic_server(error(529, "Overloaded", retry_after_ms="10"), text("recovered")) as (base_url, server):
        engine = _engine(base_url, settings=_settings(base_url, max_retries=1))
        result = await engine.complete([HumanMessage("hi")])
        await engine.aclose()
    assert result.content == "recovered"
    assert len(server.requests) == 2


async def test_a_slow_server_runs_out_the_budget() -> None:
    with anthropic_server(Reply(text="late", delay_s=5.0)) as (base_url, _):
        engine = _engine(base_url)
        with pytest.raises(EngineTimeout):
            await engine.complete([HumanMessage("hi")], timeout_s=0.3)
        await engine.aclose()


async def test_a_refused_connection_is_engine_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    engine = _engine(f"http://127.0.0.1:{port}")
    with pytest.raises(EngineUnavailable):
        await engine.complete([HumanMessage("hi")])
    await engine.aclose()


async def test_a_refusal_is_an_engine_error() -> None:
    with anthropic_server(refusal()) as (base_url, _):
        engine = _engine(base_url)
        with pytest.raises(EngineError, match="refused"):
            await engine.complete([HumanMessage("hi")])
        await engine.aclose()


async def test_a_tool_call_cut_off_at_max_tokens_is_an_engine_error() -> None:
    cut = Reply(calls=(("lookup", {}),), stop_reason="max_tokens")
    with anthropic_server(cut) as (base_url, _):
        engine = _engine(base_url)
        with pytest.raises(EngineError, match="max_tokens"):
            await engine.complete([HumanMessage("hi")], tools=[LOOKUP], tool_runner=Runner())
        await engine.aclose()
