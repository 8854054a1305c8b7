"""``OpenAIResponsesEngine``: System 2 over OpenAI's Responses API, through the official SDK.

Only ``message`` items (their ``output_text``) and ``function_call`` items are read. Reasoning items
never reach the content: their summaries go to the opt-in thought sink at most, their
``encrypted_content`` is never touched, and none is sent back, not even within the tool loop, where
the model reasons afresh each turn (a few tokens more, no thought ever re-enters a prompt). Requests
go with ``store=False``: fastslow keeps its own history and never asks OpenAI to retain a response.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2
from langchain_core.messages import BaseMessage
from openai.types.responses import Response

from fastslow.engines._sdk_errors import openai_errors, request_timeout
from fastslow.router import ConfigError, EngineError, EngineProtocolError, ToolCall
from fastslow.router.engine_api import ChatResult, ToolSpec, Usage, trace_headers
from fastslow.router.settings import System2Settings

from ._cost import call_cost
from ._openai import client_args
from ._openai_client import OpenAISdkEngine
from ._ref import ModelRef
from ._responses_input import function_tools, to_input
from ._thoughts import final_content, inline_thoughts

__all__ = ["OpenAIResponsesEngine"]


def _thought_texts(item: Any) -> list[str]:
    """A reasoning item's readable text (summaries and, when returned, its reasoning text)."""
    parts = [*(getattr(item, "summary", None) or ()), *(getattr(item, "content", None) or ())]
    return [text for part in parts if isinstance(text := getattr(part, "text", None), str)]


class OpenAIResponsesEngine(OpenAISdkEngine):
    """A ``ChatEngine`` over ``client.responses.create``, for ``openai:`` model references.

    Args:
        settings: key and base URL (``openai_api_key``/``openai_base_url``, falling back to
            ``OPENAI_API_KEY``/``OPENAI_BASE_URL``), time budget, retries and prices.
        ref: the model, as a reference or its string; ``settings.default`` when ``None``.
        http_client: an ``httpx2.AsyncClient`` to send requests through. The caller keeps
            ownership: ``aclose`` leaves it open.
        on_thought: debugging only: called with the text of each thought (reasoning summaries
            and inline thought markup; never encrypted content), as ``ThoughtSink.for_model``
            gives it. It must not raise; if it does, the error is logged and the call goes on.

    Raises:
        ConfigError: the reference is malformed or not an ``openai:`` one.
    """

    name: str = "openai-responses"

    def __init__(
        self,
        settings: System2Settings,
        ref: ModelRef | str | None = None,
        *,
        http_client: httpx2.AsyncClient | None = None,
        on_thought: Callable[[str], None] | None = None,
    ) -> None:
        parsed = ref if isinstance(ref, ModelRef) else ModelRef.parse(ref or settings.default)
        if parsed.provider != "openai":
            raise ConfigError(f"{parsed}: the Responses API serves openai: references only", key="system2")
        super().__init__(
            settings, parsed, client_args(parsed, settings), http_client=http_client, on_thought=on_thought
        )

    async def _once(
        self,
        messages: Sequence[BaseMessage],
        budget: float,
        *,
        tools: Sequence[ToolSpec],
        schema: Mapping[str, Any] | None,
    ) -> ChatResult:
        instructions, items = to_input(messages)
        request: dict[str, Any] = {"model": self.model, "input": items, "store": False}
        if instructions is not None:
            request["instructions"] = instructions
        if tools:
            request["tools"] = function_tools(tools)
        if schema is not None:
            request["text"] = {
                "format": {"type": "json_schema", "name": "answer", "schema": dict(schema), "strict": True}
            }
        async with openai_errors(self.name, budget) as deadline:
            response = await self._client.responses.create(
                **request, timeout=request_timeout(deadline, self.name), extra_headers=trace_headers()
            )
        try:
            return self._result(response, structured=schema is not None)
        except (AttributeError, TypeError, KeyError, IndexError) as exc:
            # The SDK builds replies without validating them; a malformed body surfaces here.
            raise EngineProtocolError(f"cannot read the response: {exc!r}", engine=self.name) from exc

    def _result(self, response: Response, *, structured: bool) -> ChatResult:
        if response.error is not None:
            raise EngineError(f"the model failed: {response.error.code}: {response.error.message}", engine=self.name)
        texts: list[str] = []
        refusals: list[str] = []
        calls: list[ToolCall] = []
        thoughts: list[str] = []
        for item in response.output:
            kind = getattr(item, "type", None)
            if kind == "message":
                for part in getattr(item, "content", None) or ():
                    if getattr(part, "type", None) == "output_text":
                        texts.append(part.text)
                    elif getattr(part, "type", None) == "refusal":
                        refusals.append(part.refusal)
            elif kind == "function_call":
                calls.append(self._tool_call(item))
            elif kind == "reasoning":
                thoughts.extend(_thought_texts(item))
            # Anything else (hosted tool calls fastslow never offers) carries no final content.
        raw = "".join(texts)
        self._thought([*thoughts, *inline_thoughts(raw)])
        if refusals and not texts and not calls:
            raise EngineError(f"the model refused: {' '.join(refusals)}", engine=self.name)
        if response.status == "incomplete" and not calls:
            reason = getattr(response.incomplete_details, "reason", None) or "unknown reason"
            raise EngineError(f"the model stopped before finishing ({reason})", engine=self.name)
        content = final_content(raw)
        parsed: Any = None
        if structured and not calls:
            parsed = self._parse_structured(content)
        usage, cost = self._usage(response)
        return ChatResult(
            content=content,
            model=response.model or self.model,
            tool_calls=tuple(calls),
            structured=parsed,
            usage=usage,
            cost_usd=cost,
        )

    def _usage(self, response: Response) -> tuple[Usage, float | None]:
        usage = response.usage
        if usage is None:
            return Usage(), None
        cached = getattr(getattr(usage, "input_tokens_details", None), "cached_tokens", None) or 0
        # ``output_tokens`` already includes the reasoning tokens, which are billed as output.
        cost = call_cost(
            self._price,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=cached,
        )
        return Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens), cost

    def _tool_call(self, item: Any) -> ToolCall:
        try:
            args = json.loads(item.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise EngineProtocolError(
                f"arguments of tool call {item.name!r} are not JSON: {exc}", engine=self.name
            ) from exc
        if not isinstance(args, dict):
            raise EngineProtocolError(f"arguments of tool call {item.name!r} are not an object", engine=self.name)
        return ToolCall(id=item.call_id, name=item.name, args=args)
