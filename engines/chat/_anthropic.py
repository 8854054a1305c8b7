"""``AnthropicChatEngine``: System 2 over Anthropic's Messages API, through the official ``anthropic`` SDK.

Only final content leaves the engine. With extended thinking on, Anthropic requires the signed
``thinking`` / ``redacted_thinking`` blocks that precede a ``tool_use`` to be sent back, exactly as
received, in the same model's tool loop (openai-agents #1704, LiteLLM #38809). So the tool loop runs
inside ``complete``: the blocks travel between rounds there and are dropped when it ends; they never
reach a ``ChatResult``, a graph state or a later call (where another model could not verify them).

Structured output is a forced tool named ``answer`` whose ``input_schema`` is the schema, and its
``input`` is the structured value: this works on every Claude model and Anthropic-compatible proxy.
Anthropic forbids a forced ``tool_choice`` while thinking is on, so calls with a ``schema`` run with
thinking off: a typed answer needs the constraint more than the extra reasoning.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message, RedactedThinkingBlock, TextBlock, ThinkingBlock, ToolUseBlock
from anthropic.types import Usage as MessageUsage
from langchain_core.messages import BaseMessage

from fastslow.engines._sdk_errors import request_timeout
from fastslow.router import ConfigError, EngineError, EngineProtocolError, ToolCall
from fastslow.router.engine_api import (
    ChatResult,
    Deadline,
    ToolRunner,
    ToolSpec,
    ToolStep,
    Usage,
    strip_thoughts,
    trace_headers,
)
from fastslow.router.settings import ModelPrice, System2Settings

from ._anthropic_errors import anthropic_errors
from ._anthropic_messages import anthropic_tools, to_anthropic
from ._cost import call_cost, total_cost
from ._loop import MAX_TOOL_ROUNDS
from ._ref import ModelRef

__all__ = ["ANSWER_TOOL", "MAX_TOOL_ROUNDS", "AnthropicChatEngine"]

logger = logging.getLogger(__name__)

ANSWER_TOOL = "answer"
"""The forced tool that carries structured output; no caller tool may take this name."""
DEFAULT_MAX_TOKENS = 4096
MIN_THINKING_BUDGET = 1024
"""Anthropic's floor for ``budget_tokens``."""

# Anthropic bills cache writes at a multiple of the base input price: 1.25x for the 5-minute cache,
# 2x for the 1-hour one. Cache reads cost ``ModelPrice.cached_input`` (``input`` when unset).
_CACHE_WRITE_5M = 1.25
_CACHE_WRITE_1H = 2.0

Block = dict[str, Any]


def _api_key(settings: System2Settings) -> str | None:
    """The key to send, ``"unused"`` for a keyless server at a configured base URL, ``None`` when unconfigured."""
    if settings.anthropic_api_key is not None:
        return settings.anthropic_api_key.get_secret_value()
    if from_env := os.environ.get("ANTHROPIC_API_KEY"):
        return from_env
    if settings.anthropic_base_url or os.environ.get("ANTHROPIC_BASE_URL"):
        return "unused"  # an Anthropic-compatible proxy on our own network may need no key
    return None


def _usage(usage: MessageUsage) -> Usage:
    # Anthropic's ``input_tokens`` leaves out cached tokens; the total input is the sum of all three.
    cached = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    return Usage(input_tokens=usage.input_tokens + cached, output_tokens=usage.output_tokens)


def _cost(price: ModelPrice | None, usage: MessageUsage) -> float | None:
    read = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    written_1h = usage.cache_creation.ephemeral_1h_input_tokens if usage.cache_creation else 0
    base = call_cost(
        price, input_tokens=usage.input_tokens + read, output_tokens=usage.output_tokens, cached_input_tokens=read
    )
    if price is None or base is None:
        return None
    writes = ((written - written_1h) * _CACHE_WRITE_5M + written_1h * _CACHE_WRITE_1H) * price.input
    return base + writes / 1_000_000


def _answer_tool(schema: Mapping[str, Any]) -> Block:
    return {
        "name": ANSWER_TOOL,
        "description": "Give your final answer, in exactly this form.",
        "input_schema": dict(schema),
    }


class AnthropicChatEngine:
    """A ``ChatEngine`` over Anthropic's Messages API, for ``anthropic:`` model references.

    Args:
        settings: key, base URL, time budget, retries and prices (``system2``). The key is
            ``anthropic_api_key``, else ``ANTHROPIC_API_KEY``; the base URL is ``anthropic_base_url``,
            else ``ANTHROPIC_BASE_URL``, else Anthropic's API.
        ref: the model, as a reference or its string; ``settings.default`` when ``None``.
        http_client: an ``httpx2.AsyncClient`` to send requests through. The caller keeps
            ownership: ``aclose`` leaves it open.
        thinking_budget: turn extended thinking on with this many tokens (at least 1024). Thinking
            needs the tool loop to run inside the engine: tools without a ``tool_runner`` are then
            refused, since a caller running tools itself would have to carry the signed blocks.
            Calls with a ``schema`` run with thinking off (see the module docstring).
        max_tokens: most tokens of visible output per round; the thinking budget comes on top.
        on_thought: debugging only: called with the text of each thinking block (never with
            redacted data). It must not raise; if it does, the error is logged and the call goes on.

    Raises:
        ConfigError: the reference is malformed or not an ``anthropic:`` one, or the thinking
            budget is below 1024 tokens. A missing key is only reported when a call is made.
    """

    ref: ModelRef
    name: str
    """Always ``anthropic-chat``."""
    model: str

    def __init__(
        self,
        settings: System2Settings,
        ref: ModelRef | str | None = None,
        *,
        http_client: httpx2.AsyncClient | None = None,
        thinking_budget: int | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        on_thought: Callable[[str], None] | None = None,
    ) -> None:
        self.ref = ref if isinstance(ref, ModelRef) else ModelRef.parse(ref or settings.default)
        if self.ref.provider != "anthropic":
            raise ConfigError(f"{self.ref} is not an anthropic: reference", key="system2")
        if thinking_budget is not None and thinking_budget < MIN_THINKING_BUDGET:
            raise ConfigError(f"thinking_budget must be at least {MIN_THINKING_BUDGET} tokens, not {thinking_budget}")
        self.name = "anthropic-chat"
        self.model = self.ref.model
        self._thinking_budget = thinking_budget
        self._max_tokens = max_tokens
        self._on_thought = on_thought
        self._price = settings.prices.get(str(self.ref))
        self._timeout_s = settings.timeout_s
        api_key = _api_key(settings)
        self._configured = api_key is not None
        self._owns_http = http_client is None
        self._client = anthropic.AsyncAnthropic(
            # An explicit key (even a placeholder) keeps the SDK from looking for credentials on disk;
            # an unconfigured engine fails in ``complete`` with a ConfigError instead.
            api_key=api_key or "unused",
            base_url=settings.anthropic_base_url,  # None: ANTHROPIC_BASE_URL, then api.anthropic.com
            http_client=http_client,
            max_retries=settings.max_retries,  # the one retry loop is the SDK's
            timeout=settings.timeout_s,
            # The SDK's own span (a child of fastslow's System-2 span) keeps to metadata whatever the
            # ANTHROPIC_OPEN_TELEMETRY_* variables say: content would include thinking blocks.
            open_telemetry={"traces": {"content_mode": "metadata_only"}},
        )

    @property
    def base_url(self) -> str:
        """The server's root, read by the router's egress check for ``local_only`` tasks."""
        return str(self._client.base_url)

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: ToolRunner | None = None,
    ) -> ChatResult:
        """Answer ``messages``; with ``schema``, force the ``answer`` tool and return its input in ``structured``.

        With ``tool_runner``, each tool call goes through it (the caller's policy gate) and its
        outcome goes back as a ``tool_result`` until the model answers without tools, at most
        ``MAX_TOOL_ROUNDS`` rounds; within the loop the signed thinking blocks are sent back as
        received. Without it, the calls are returned in ``tool_calls`` for the caller to run.

        ``timeout_s`` (the settings' ``timeout_s`` when ``None``) bounds the whole call: every
        round and the SDK's retries. A tool already running is not cancelled; the next round then
        fails with ``EngineTimeout``.

        Raises:
            ConfigError: no API key or base URL is configured; tools without a ``tool_runner``
                while thinking is on; a tool named ``answer`` alongside a ``schema``.
            InvalidRequest: a message the wire cannot carry.
            EngineTimeout: the budget ran out.
            EngineUnavailable: the server could not be reached.
            EngineHTTPError: the server answered with an error status (after the SDK's retries).
            EngineProtocolError: the reply cannot be read, or a ``schema`` call got no answer.
            EngineError: the model refused, was cut off inside a tool call, or used up the rounds.
        """
        if not self._configured:
            raise ConfigError(
                "no API key: set system2.anthropic_api_key or ANTHROPIC_API_KEY", key="system2.anthropic_api_key"
            )
        thinking = self._thinking_budget is not None and schema is None
        if thinking and tools and tool_runner is None:
            raise ConfigError(
                "tools with thinking on need a tool_runner: the signed thinking blocks must go back to the model"
                " with the tool results, and they never leave the engine",
                key="thinking_budget",
            )
        if schema is not None and any(tool.name == ANSWER_TOOL for tool in tools):
            raise ConfigError(f"the tool name {ANSWER_TOOL!r} is reserved for structured output", key="tools")
        system, turns = to_anthropic(messages)
        request = self._request(system, tools, schema, thinking=thinking)
        deadline = Deadline(timeout_s if timeout_s is not None else self._timeout_s)
        steps: list[ToolStep] = []
        usage = Usage()
        costs: list[float | None] = []
        for _ in range(MAX_TOOL_ROUNDS):
            message = await self._create(request, turns, deadline)
            text, calls, echo = self._read(message)
            usage += _usage(message.usage)
            costs.append(_cost(self._price, message.usage))
            cost = total_cost(costs)
            answer = next((call for call in calls if call.name == ANSWER_TOOL), None) if schema else None
            if answer is not None:
                content = json.dumps(dict(answer.args), ensure_ascii=False)
                return self._result(message, content, (), steps, usage, cost, structured=dict(answer.args))
            if not calls or tool_runner is None:
                if schema is not None and not calls:
                    raise EngineProtocolError(f"the model did not call the {ANSWER_TOOL!r} tool", engine=self.name)
                return self._result(message, text, tuple(calls), steps, usage, cost)
            # Anthropic verifies the signed thinking blocks of the turn that asked for the tools.
            turns.append({"role": "assistant", "content": echo})
            turns.append({"role": "user", "content": [await self._run(call, tool_runner, steps) for call in calls]})
        raise EngineError(f"no final answer after {MAX_TOOL_ROUNDS} tool rounds", engine=self.name)

    async def aclose(self) -> None:
        """Close the SDK client's connections, unless the HTTP client was passed in."""
        if self._owns_http:
            await self._client.close()

    def _request(
        self, system: str | None, tools: Sequence[ToolSpec], schema: Mapping[str, Any] | None, *, thinking: bool
    ) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.model, "max_tokens": self._max_tokens}
        if system:
            request["system"] = system
        wire_tools = anthropic_tools(tools)
        if schema is not None:
            wire_tools.append(_answer_tool(schema))
            # With caller tools the model may use them first; one tool per round, so ``answer`` never
            # arrives alongside calls whose results it has not seen.
            request["tool_choice"] = (
                {"type": "any", "disable_parallel_tool_use": True} if tools else {"type": "tool", "name": ANSWER_TOOL}
            )
        if wire_tools:
            request["tools"] = wire_tools
        if thinking and self._thinking_budget is not None:
            request["thinking"] = {"type": "enabled", "budget_tokens": self._thinking_budget}
            request["max_tokens"] = self._max_tokens + self._thinking_budget  # thinking counts toward max_tokens
        elif self._thinking_budget is not None:
            # Explicitly off: some models think by default, and a forced tool_choice forbids thinking.
            request["thinking"] = {"type": "disabled"}
        return request

    async def _create(self, request: Mapping[str, Any], turns: list[Block], deadline: Deadline) -> Message:
        params: dict[str, Any] = {**request, "messages": turns}  # plain dicts, not the SDK's TypedDicts
        async with anthropic_errors(self.name, deadline):
            message = await self._client.messages.create(
                **params, timeout=request_timeout(deadline, self.name), extra_headers=trace_headers()
            )
        if not isinstance(message, Message):
            raise EngineProtocolError(f"unexpected reply {type(message).__name__}", engine=self.name)
        return message

    def _read(self, message: Message) -> tuple[str, list[ToolCall], list[Block]]:
        """The final text, the tool calls, and the assistant turn to send back within the loop."""
        try:
            if message.stop_reason == "refusal":
                details = message.stop_details
                why = f" ({details.category}: {details.explanation})" if details and details.category else ""
                raise EngineError(f"the model refused{why}", engine=self.name)
            texts: list[str] = []
            calls: list[ToolCall] = []
            echo: list[Block] = []
            for block in message.content:
                if isinstance(block, ThinkingBlock):
                    self._thought(block.thinking)
                    echo.append({"type": "thinking", "thinking": block.thinking, "signature": block.signature})
                elif isinstance(block, RedactedThinkingBlock):
                    echo.append({"type": "redacted_thinking", "data": block.data})
                elif isinstance(block, TextBlock):
                    texts.append(block.text)
                    if block.text:
                        echo.append({"type": "text", "text": block.text})
                elif isinstance(block, ToolUseBlock):
                    if not isinstance(block.input, dict):
                        raise EngineProtocolError(
                            f"input of tool call {block.name!r} is not an object", engine=self.name
                        )
                    calls.append(ToolCall(id=block.id, name=block.name, args=block.input))
                    echo.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
                # Server-tool blocks cannot appear: this engine offers no server tools.
        except (AttributeError, TypeError, KeyError) as exc:
            # The SDK builds replies without validating them; a malformed body surfaces here.
            raise EngineProtocolError(f"cannot read the message: {exc!r}", engine=self.name) from exc
        if calls and message.stop_reason == "max_tokens":
            raise EngineError("the reply was cut off at max_tokens inside a tool call", engine=self.name)
        return strip_thoughts("".join(texts)), calls, echo

    def _thought(self, text: str) -> None:
        if self._on_thought is None or not text:
            return
        try:
            self._on_thought(text)
        except Exception:  # a debugging sink must never fail a call
            logger.warning("the thought sink failed", exc_info=True)

    async def _run(self, call: ToolCall, tool_runner: ToolRunner, steps: list[ToolStep]) -> Block:
        outcome = await tool_runner(call)
        steps.append(ToolStep(call=call, outcome=outcome))
        result: Block = {"type": "tool_result", "tool_use_id": call.id, "content": outcome.content}
        if outcome.is_error:
            result["is_error"] = True
        return result

    def _result(
        self,
        message: Message,
        content: str,
        calls: tuple[ToolCall, ...],
        steps: list[ToolStep],
        usage: Usage,
        cost: float | None,
        *,
        structured: Any = None,
    ) -> ChatResult:
        return ChatResult(
            content=content,
            model=message.model or self.model,
            tool_calls=calls,
            steps=tuple(steps),
            structured=structured,
            usage=usage,
            cost_usd=cost,
        )
