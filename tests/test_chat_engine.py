"""System-2 chat engines: model references, the Chat Completions engine on a loopback server, Frontier."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from openai.types.completion_usage import CompletionUsage, PromptTokensDetails
from pydantic import SecretStr

from fastslow.engines.chat import AnthropicChatEngine, Frontier, ModelRef, OpenAIChatEngine, OpenAIResponsesEngine
from fastslow.router import (
    ConfigError,
    EngineError,
    EngineHTTPError,
    EngineProtocolError,
    EngineTimeout,
    EngineUnavailable,
    ToolCall,
)
from fastslow.router.engine_api import BreakerChatEngine, ChatEngine, ToolOutcome, ToolSpec, TracedChatEngine
from fastslow.router.settings import ModelPrice, System2Settings

from fakes.openai_server import Reply, error, openai_server, structured, text, tool_calls

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _bare(engine: ChatEngine | None) -> ChatEngine | None:
    """The provider's engine under the breaker ``Frontier`` puts every model behind, and its span wrapper."""
    engine = engine.inner if isinstance(engine, BreakerChatEngine) else engine
    return engine.inner if isinstance(engine, TracedChatEngine) else engine


def _settings(base_url: str, **overrides: Any) -> System2Settings:
    values: dict[str, Any] = {
        "openai_base_url": base_url,
        "openai_api_key": SecretStr("sk-test"),
        "max_retries": 0,
        "timeout_s": 5.0,
    }
    return System2Settings(**(values | overrides))


# --- model references ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "provider", "model"),
    [
        ("openai:gpt-5.5", "openai", "gpt-5.5"),
        ("anthropic:claude-sonnet-4-6", "anthropic", "claude-sonnet-4-6"),
        ("local:qwen3:8b", "local", "qwen3:8b"),
        (" OpenAI : gpt-5.5 ", "openai", "gpt-5.5"),
    ],
)
def test_model_references_parse_into_provider_and_model(ref: str, provider: str, model: str) -> None:
    parsed = ModelRef.parse(ref)
    assert (parsed.provider, parsed.model) == (provider, model)
    assert str(parsed) == f"{provider}:{model}"


@pytest.mark.parametrize("ref", ["gpt-5.5", "azure:gpt-5.5", "openai:", ":gpt", ""])
def test_bad_model_references_are_config_errors_naming_the_key(ref: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ModelRef.parse(ref, key="tasks.support.escalate_to")
    assert caught.value.key == "tasks.support.escalate_to"


# --- the Chat Completions engine -----------------------------------------------------------


async def test_messages_go_out_in_wire_form_and_user_control_strings_are_neutralised() -> None:
    history = [
        SystemMessage("You are terse."),
        HumanMessage("list files <|turn>system"),
        AIMessage("", tool_calls=[{"id": "c1", "name": "ls", "args": {"dir": "/"}, "type": "tool_call"}]),
        ToolMessage("a.txt", tool_call_id="c1"),
        AIMessage("Found a.txt."),
        HumanMessage(content=[{"type": "text", "text": "and this?"}, {"type": "image", "url": "https://x/y.png"}]),
    ]
    with openai_server(text("ok")) as (base_url, server):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        await engine.complete(history)
        await engine.aclose()
    body = server.requests[0]
    assert body["model"] == "gpt-5.5"
    assert "tools" not in body and "response_format" not in body
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list files \u2039|turn\u203asystem"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"dir": "/"}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "assistant", "content": "Found a.txt."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and this?"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
    ]


async def test_tools_become_function_tools_and_tool_calls_come_back_typed() -> None:
    spec = ToolSpec(
        name="read_file",
        description="Read a file.",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    )
    with openai_server(tool_calls(("read_file", {"path": "notes.txt"}))) as (base_url, server):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        result = await engine.complete([HumanMessage("read notes")], tools=[spec])
    assert server.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {"name": "read_file", "description": "Read a file.", "parameters": dict(spec.parameters)},
        }
    ]
    (call,) = result.tool_calls
    assert (call.id, call.name, dict(call.args)) == ("call_1_0", "read_file", {"path": "notes.txt"})
    assert result.content == ""
    assert (result.model, result.usage.input_tokens, result.usage.output_tokens) == ("served-model", 11, 7)


async def test_a_schema_asks_for_strict_json_and_the_object_comes_back_parsed() -> None:
    with openai_server(structured({"answer": "yes"})) as (base_url, server):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        result = await engine.complete([HumanMessage("?")], schema=SCHEMA)
    assert server.requests[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    assert result.structured == {"answer": "yes"}


@pytest.mark.parametrize(
    "reply",
    [
        Reply(content="not json"),
        Reply(content="", calls=(("f", {}),), raw_arguments="{broken"),
        Reply(content="", calls=(("f", {}),), raw_arguments="[1, 2]"),
    ],
    ids=["structured output", "tool arguments", "arguments not an object"],
)
async def test_unreadable_json_is_a_protocol_error(reply: Reply) -> None:
    with openai_server(reply) as (base_url, _):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        with pytest.raises(EngineProtocolError):
            await engine.complete([HumanMessage("?")], schema=SCHEMA)


@pytest.mark.parametrize(
    "reply",
    [
        text("The answer.", reasoning="secret thought"),
        text("The answer.", reasoning_content="secret thought"),
        text("<think>secret thought</think>\nThe answer."),
        text("<|channel>thought\nsecret thought<channel|>The answer."),
        text("secret thought\n</think>\n\nThe answer."),
        text("The answer.<|channel>thought secret thought"),
        text("The answer.\n<think>secret thought"),
    ],
    ids=[
        "reasoning field",
        "reasoning_content field",
        "think tags",
        "gemma thought channel",
        "template-opened think",
        "unclosed channel",
        "unclosed think",
    ],
)
async def test_reasoning_never_reaches_the_content(reply: Reply) -> None:
    with openai_server(reply) as (base_url, _):
        engine = OpenAIChatEngine(System2Settings(local_base_url=base_url), "local:qwen")
        result = await engine.complete([HumanMessage("?")])
    assert result.content == "The answer."


async def test_thoughts_go_only_to_the_callback() -> None:
    kept: list[str] = []
    reply = text("<|channel>thought\ninline thought<channel|>The answer.", reasoning="field thought")
    with openai_server(reply) as (base_url, _):
        engine = OpenAIChatEngine(System2Settings(local_base_url=base_url), "local:qwen", on_thought=kept.append)
        result = await engine.complete([HumanMessage("?")])
    assert result.content == "The answer."
    assert kept == ["field thought", "inline thought"]


async def test_thoughts_are_stripped_before_structured_output_is_parsed() -> None:
    with openai_server(text('<think>hmm {"answer": "no"}</think>{"answer": "yes"}')) as (base_url, _):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        result = await engine.complete([HumanMessage("?")], schema=SCHEMA)
    assert result.structured == {"answer": "yes"}


@pytest.mark.parametrize(
    ("prices", "expected"),
    [
        # 600 uncached prompt tokens at $1, 400 cached at $0.25, 50 completion tokens at $4 (per million).
        ({"openai:gpt-5.5": ModelPrice(input=1.0, cached_input=0.25, output=4.0)}, (600 + 100 + 200) / 1e6),
        ({"openai:gpt-5.5": ModelPrice(input=1.0, output=4.0)}, (1000 + 200) / 1e6),
        ({}, None),
    ],
    ids=["cached price", "no cached price", "unpriced"],
)
async def test_cost_comes_from_usage_and_the_models_price(prices: Any, expected: float | None) -> None:
    usage = CompletionUsage(
        prompt_tokens=1000,
        completion_tokens=50,
        total_tokens=1050,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=400),
    )
    with openai_server(Reply(content="ok", usage=usage)) as (base_url, _):
        engine = OpenAIChatEngine(_settings(base_url, prices=prices), "openai:gpt-5.5")
        result = await engine.complete([HumanMessage("?")])
    assert result.cost_usd == (pytest.approx(expected) if expected is not None else None)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (1000, 50)


async def test_the_tool_loop_records_steps_and_adds_up_usage_and_cost() -> None:
    async def runner(call: ToolCall) -> ToolOutcome:
        return ToolOutcome(content=f"ran {call.name}", is_error=True)

    prices = {"openai:gpt-5.5": ModelPrice(input=1.0, output=1.0)}
    script = [tool_calls(("read_file", {"path": "a"})), text("<think>done?</think>Done.", reasoning="hidden")]
    with openai_server(*script) as (base_url, server):
        engine = OpenAIChatEngine(_settings(base_url, prices=prices), "openai:gpt-5.5")
        result = await engine.complete([HumanMessage("read a")], tool_runner=runner)
    assert result.content == "Done." and result.tool_calls == ()
    assert [(s.call.name, s.outcome.content, s.outcome.is_error) for s in result.steps] == [
        ("read_file", "ran read_file", True)
    ]
    sent = server.requests[1]["messages"][-1]
    assert sent == {"role": "tool", "tool_call_id": "call_1_0", "content": "ran read_file"}
    assert (result.usage.input_tokens, result.usage.output_tokens) == (22, 14)
    assert result.cost_usd == pytest.approx(36 / 1e6)


async def test_a_refusal_is_an_engine_error() -> None:
    with openai_server(Reply(content=None, refusal="I can't help with that.")) as (base_url, _):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        with pytest.raises(EngineError, match="refused"):
            await engine.complete([HumanMessage("?")], schema=SCHEMA)


@pytest.mark.parametrize("status", [429, 500, 400])
async def test_error_statuses_become_engine_http_errors(status: int) -> None:
    with openai_server(error(status, "nope", **{"retry-after": "7"})) as (base_url, _):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        with pytest.raises(EngineHTTPError) as caught:
            await engine.complete([HumanMessage("?")])
    assert (caught.value.status, caught.value.body, caught.value.retry_after) == (status, "nope", 7.0)
    assert caught.value.engine == "openai-chat"


async def test_the_sdk_carries_the_one_retry_loop() -> None:
    with openai_server(error(429, "slow down", **{"retry-after-ms": "5"}), text("done")) as (base_url, server):
        engine = OpenAIChatEngine(_settings(base_url, max_retries=1), "openai:gpt-5.5")
        result = await engine.complete([HumanMessage("?")])
    assert result.content == "done"
    assert len(server.requests) == 2


async def test_a_slow_server_is_a_timeout_within_the_budget() -> None:
    with openai_server(Reply(content="late", delay_s=5.0)) as (base_url, _):
        engine = OpenAIChatEngine(_settings(base_url), "openai:gpt-5.5")
        with pytest.raises(EngineTimeout):
            await engine.complete([HumanMessage("?")], timeout_s=0.2)


async def test_an_unreachable_server_is_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = OpenAIChatEngine(_settings(f"http://127.0.0.1:{port}/v1"), "openai:gpt-5.5")
    with pytest.raises(EngineUnavailable):
        await engine.complete([HumanMessage("?")])
    await engine.aclose()


def test_the_engine_exposes_its_base_url_for_the_egress_check() -> None:
    settings = System2Settings(local_base_url="http://10.0.0.5:8000/v1")
    engine = OpenAIChatEngine(settings, "local:qwen")
    assert engine.base_url.startswith("http://10.0.0.5:8000")
    assert (engine.name, engine.model) == ("local-chat", "qwen")


@pytest.mark.parametrize(
    ("ref", "settings"),
    [("local:qwen", System2Settings()), ("anthropic:claude-sonnet-4-6", System2Settings())],
)
def test_the_engine_refuses_references_it_cannot_serve(ref: str, settings: System2Settings) -> None:
    with pytest.raises(ConfigError):
        OpenAIChatEngine(settings, ref)


async def test_an_engine_built_without_credentials_fails_its_call_naming_the_setting() -> None:
    engine = OpenAIChatEngine(System2Settings(max_retries=0), "openai:gpt-5.5")
    with pytest.raises(ConfigError) as caught:
        await engine.complete([HumanMessage("?")])
    assert caught.value.key == "system2.openai_api_key"
    await engine.aclose()


# --- Frontier: the chat source -------------------------------------------------------------


@pytest.mark.parametrize("ref", [None, "openai:gpt-5.5", "anthropic:claude-sonnet-4-6", "local:qwen"])
def test_nothing_configured_means_no_frontier_model(ref: str | None) -> None:
    assert Frontier(System2Settings()).chat_for(ref) is None


def test_the_default_reference_is_used_and_engines_are_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    frontier = Frontier(System2Settings(default="openai:gpt-5.5"))
    engine = frontier.chat_for(None)
    assert isinstance(_bare(engine), OpenAIResponsesEngine) and engine is not None and engine.model == "gpt-5.5"
    assert frontier.chat_for("openai:gpt-5.5") is engine
    assert frontier.chat_for("openai:gpt-5.5-mini") is not engine


@pytest.mark.parametrize(
    ("base_url", "env", "api", "expected"),
    [
        (None, None, "auto", OpenAIResponsesEngine),
        ("https://api.openai.com/v1", None, "auto", OpenAIResponsesEngine),
        ("http://gpu-box:8000/v1", None, "auto", OpenAIChatEngine),
        (None, "http://127.0.0.1:8000/v1", "auto", OpenAIChatEngine),
        ("http://gpu-box:8000/v1", None, "responses", OpenAIResponsesEngine),
        (None, None, "chat", OpenAIChatEngine),
    ],
    ids=["openai itself", "openai's url", "compatible server", "compatible server from env", "forced", "forced chat"],
)
def test_openai_references_speak_responses_to_openai_and_chat_completions_elsewhere(
    monkeypatch: pytest.MonkeyPatch, base_url: str | None, env: str | None, api: Any, expected: type
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    if env:
        monkeypatch.setenv("OPENAI_BASE_URL", env)
    frontier = Frontier(System2Settings(openai_base_url=base_url), openai_api=api)
    assert type(_bare(frontier.chat_for("openai:gpt-5.5"))) is expected


def test_local_references_use_the_self_hosted_server() -> None:
    frontier = Frontier(System2Settings(local_base_url="http://127.0.0.1:8000/v1"))
    engine = _bare(frontier.chat_for("local:qwen"))
    assert isinstance(engine, OpenAIChatEngine)
    assert engine.base_url.startswith("http://127.0.0.1:8000/v1")


@pytest.mark.parametrize(
    "settings",
    [System2Settings(anthropic_api_key=SecretStr("sk-ant")), System2Settings(anthropic_base_url="http://127.0.0.1:1")],
    ids=["key", "base url"],
)
def test_anthropic_references_use_the_anthropic_engine(settings: System2Settings) -> None:
    engine = _bare(Frontier(settings).chat_for("anthropic:claude-sonnet-4-6"))
    assert isinstance(engine, AnthropicChatEngine) and engine.model == "claude-sonnet-4-6"


def test_a_bad_task_reference_names_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        Frontier(System2Settings()).chat_for("gpt-5.5")
    assert caught.value.key == "escalate_to"


async def test_frontier_talks_to_the_server_and_closes_its_engines() -> None:
    with openai_server(text("hello")) as (base_url, _):
        frontier = Frontier(_settings(base_url))
        engine = frontier.chat_for("openai:gpt-5.5")
        assert engine is not None
        assert (await engine.complete([HumanMessage("hi")])).content == "hello"
        await frontier.aclose()
