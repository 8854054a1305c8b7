"""``OpenAIChatEngine``: System 2 over the Chat Completions API of OpenAI or any compatible server (vLLM).

Only final content leaves the engine. Servers that reason return it apart (vLLM's ``reasoning`` /
``reasoning_content`` fields, never read into the content) or inline (``<think>…</think>``, Gemma's
``<|channel>thought…<channel|>``, closed or not), which is cut from the content. Either kind goes to
the opt-in thought sink at most (``ThoughtSink``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2
from langchain_core.messages import BaseMessage
from openai.types.chat import ChatCompletion

from fastslow.engines._sdk_errors import api_key_or_deferred_error, openai_errors, request_timeout
from fastslow.router import ConfigError, EngineError, EngineProtocolError, ToolCall
from fastslow.router.engine_api import ChatResult, ToolSpec, Usage, trace_headers
from fastslow.router.settings import System2Settings

from ._cost import call_cost
from ._messages import function_tools, to_wire
from ._openai_client import OpenAISdkEngine
from ._ref import ModelRef
from ._thoughts import final_content, inline_thoughts

__all__ = ["OpenAIChatEngine", "client_args"]


_REASONING_FIELDS = ("reasoning", "reasoning_content")
"""vLLM's message fields for a reasoning parser's output (``reasoning_content`` before recipes PR #322)."""


def client_args(ref: ModelRef, settings: System2Settings) -> dict[str, Any]:
    """The SDK's ``base_url`` and ``api_key`` for ``ref``'s provider (the Responses engine uses it too)."""
    if ref.provider == "openai":
        # ``None`` lets the SDK read OPENAI_BASE_URL, then use api.openai.com.
        base_url = settings.openai_base_url
        api_key = api_key_or_deferred_error(
            settings.openai_api_key, setting="system2.openai_api_key", env="OPENAI_API_KEY"
        )
        if not isinstance(api_key, str) and (base_url or os.environ.get("OPENAI_BASE_URL")):
            api_key = "unused"  # a self-hosted OpenAI-compatible server needs no key
        return {"base_url": base_url, "api_key": api_key}
    if ref.provider == "local":
        if not settings.local_base_url:
            raise ConfigError(f"{ref} needs a self-hosted server", key="system2.local_base_url")
        return {
            "base_url": settings.local_base_url,
            "api_key": api_key_or_deferred_error(settings.local_api_key, setting="system2.local_api_key"),
        }
    raise ConfigError(f"{ref} is not served over Chat Completions; use an openai: or local: reference", key="system2")


class OpenAIChatEngine(OpenAISdkEngine):
    """A ``ChatEngine`` over Chat Completions, for ``openai:`` and ``local:`` model references.

    Args:
        settings: keys, base URLs, time budget and retries (``system2``). An ``openai:`` reference
            uses ``openai_api_key``/``openai_base_url`` (falling back to ``OPENAI_API_KEY``/
            ``OPENAI_BASE_URL``); a ``local:`` one uses ``local_base_url``/``local_api_key``.
        ref: the model, as a reference or its string; ``settings.default`` when ``None``.
        http_client: an ``httpx2.AsyncClient`` to send requests through. The caller keeps
            ownership: ``aclose`` leaves it open.
        on_thought: debugging only: called with the text of each thought (vLLM's ``reasoning`` /
            ``reasoning_content`` fields and inline thought markup), as ``ThoughtSink.for_model``
            gives it. It must not raise; if it does, the error is logged and the call goes on.

    Raises:
        ConfigError: the reference is malformed, is an ``anthropic:`` one, or is ``local:`` with
            no ``local_base_url``.
    """

    name: str
    """``openai-chat`` or ``local-chat``."""

    def __init__(
        self,
        settings: System2Settings,
        ref: ModelRef | str | None = None,
        *,
        http_client: httpx2.AsyncClient | None = None,
        on_thought: Callable[[str], None] | None = None,
    ) -> None:
        parsed = ref if isinstance(ref, ModelRef) else ModelRef.parse(ref or settings.default)
        super().__init__(
            settings, parsed, client_args(parsed, settings), http_client=http_client, on_thought=on_thought
        )
        self.name = f"{parsed.provider}-chat"

    async def _once(
        self,
        messages: Sequence[BaseMessage],
        budget: float,
        *,
        tools: Sequence[ToolSpec],
        schema: Mapping[str, Any] | None,
    ) -> ChatResult:
        request: dict[str, Any] = {"model": self.model, "messages": to_wire(messages)}
        if tools:
            request["tools"] = function_tools(tools)
        if schema is not None:
            request["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": dict(schema), "strict": True},
            }
        async with openai_errors(self.name, budget) as deadline:
            completion = await self._client.chat.completions.create(
                **request, timeout=request_timeout(deadline, self.name), extra_headers=trace_headers()
            )
        try:
            return self._result(completion, structured=schema is not None)
        except (AttributeError, TypeError, KeyError, IndexError) as exc:
            # The SDK builds replies without validating them; a malformed body surfaces here.
            raise EngineProtocolError(f"cannot read the chat completion: {exc!r}", engine=self.name) from exc

    def _result(self, completion: ChatCompletion, *, structured: bool) -> ChatResult:
        if not completion.choices:
            raise EngineProtocolError("the reply has no choices", engine=self.name)
        message = completion.choices[0].message
        if message.refusal:
            raise EngineError(f"the model refused: {message.refusal}", engine=self.name)
        raw = message.content or ""
        if self._on_thought is not None:
            extra = message.model_extra or {}
            fields = [value for name in _REASONING_FIELDS if isinstance(value := extra.get(name), str)]
            self._thought([*fields, *inline_thoughts(raw)])
        content = final_content(raw)
        calls = tuple(self._tool_call(call) for call in message.tool_calls or ())
        parsed: Any = None
        if structured and not calls:
            parsed = self._parse_structured(content)
        usage, cost = self._usage(completion)
        return ChatResult(
            content=content,
            model=completion.model or self.model,
            tool_calls=calls,
            structured=parsed,
            usage=usage,
            cost_usd=cost,
        )

    def _usage(self, completion: ChatCompletion) -> tuple[Usage, float | None]:
        usage = completion.usage
        if usage is None:
            return Usage(), None
        cached = getattr(usage.prompt_tokens_details, "cached_tokens", None) or 0
        # ``completion_tokens`` already includes any reasoning tokens, which are billed as output.
        cost = call_cost(
            self._price,
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cached_input_tokens=cached,
        )
        return Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens), cost

    def _tool_call(self, call: Any) -> ToolCall:
        if getattr(call, "function", None) is None:  # a custom (free-text) tool call; we only offer functions
            raise EngineProtocolError(f"unexpected {getattr(call, 'type', '?')!r} tool call", engine=self.name)
        try:
            args = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise EngineProtocolError(
                f"arguments of tool call {call.function.name!r} are not JSON: {exc}", engine=self.name
            ) from exc
        if not isinstance(args, dict):
            raise EngineProtocolError(
                f"arguments of tool call {call.function.name!r} are not an object", engine=self.name
            )
        return ToolCall(id=call.id, name=call.function.name, args=args)
