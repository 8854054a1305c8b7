"""What both OpenAI engines share: one SDK client per engine, built from the settings."""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import httpx2
import openai
from langchain_core.messages import BaseMessage

from fastslow.router import EngineProtocolError
from fastslow.router.engine_api import ChatResult, ToolRunner, ToolSpec
from fastslow.router.settings import System2Settings

from ._loop import tool_loop
from ._ref import ModelRef

__all__ = ["OpenAISdkEngine"]

logger = logging.getLogger(__name__)


class OpenAISdkEngine(ABC):
    """Holds the ``openai.AsyncOpenAI`` client, the model, its price and the time budget, and runs
    ``complete`` (one turn, or the tool loop) over the subclass's ``_once``.

    The SDK's ``max_retries`` is the one retry loop; each request's ``timeout`` is set by the
    subclass from what is left of the call's budget.
    """

    ref: ModelRef
    name: str
    model: str
    base_url: str
    """The server's root, read by the router's egress check for ``local_only`` tasks."""

    def __init__(
        self,
        settings: System2Settings,
        ref: ModelRef,
        client_args: dict[str, object],
        *,
        http_client: httpx2.AsyncClient | None,
        on_thought: Callable[[str], None] | None,
    ) -> None:
        self.ref = ref
        self.model = ref.model
        self._timeout_s = settings.timeout_s
        self._price = settings.prices.get(str(ref))
        self._on_thought = on_thought
        self._owns_http = http_client is None
        self._client = openai.AsyncOpenAI(
            **client_args,  # type: ignore[arg-type]
            http_client=http_client,
            max_retries=settings.max_retries,
            timeout=settings.timeout_s,
        )
        self.base_url = str(self._client.base_url)

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: ToolRunner | None = None,
    ) -> ChatResult:
        """Answer ``messages``; with ``schema``, ask for strict JSON output and parse it into ``structured``.

        With ``tool_runner``, tool calls are run through it and sent back until the model answers
        without tools (at most ``MAX_TOOL_ROUNDS`` turns), all within the one time budget; ``usage``
        and ``cost_usd`` then cover every turn.

        ``timeout_s`` (the settings' ``timeout_s`` when ``None``) bounds the whole call, the SDK's
        retries included; each request's SDK timeout is what is left of it.

        Raises:
            EngineTimeout: the budget ran out.
            EngineUnavailable: the server could not be reached.
            EngineHTTPError: the server answered with an error status (after the SDK's retries).
            EngineProtocolError: the reply cannot be read, or its tool arguments or structured
                output are not the JSON asked for.
            EngineError: the model refused, failed or stopped before finishing.
        """
        budget = timeout_s if timeout_s is not None else self._timeout_s
        once = partial(self._once, tools=tools, schema=schema)
        if tool_runner is None:
            return await once(messages, budget)
        return await tool_loop(once, messages, tool_runner, budget_s=budget, engine=self.name)

    @abstractmethod
    async def _once(
        self,
        messages: Sequence[BaseMessage],
        budget: float,
        *,
        tools: Sequence[ToolSpec],
        schema: Mapping[str, Any] | None,
    ) -> ChatResult:
        """One model turn within ``budget`` seconds, thoughts already removed."""

    async def aclose(self) -> None:
        """Close the SDK client's connections, unless the HTTP client was passed in."""
        if self._owns_http:
            await self._client.close()

    def _thought(self, thoughts: list[str]) -> None:
        """Hand thoughts to the opt-in debug sink, if any; never into the result."""
        if self._on_thought is None:
            return
        try:
            for thought in thoughts:
                self._on_thought(thought)
        except Exception:  # a debugging sink must never fail a call
            logger.warning("the thought sink failed", exc_info=True)

    def _parse_structured(self, content: str) -> Any:
        """The JSON object a schema call asked for; the server answering otherwise is a protocol error."""
        try:
            return json.loads(content)
        except json.JSONDecodeError as exc:
            raise EngineProtocolError(f"structured output is not JSON: {exc}", engine=self.name) from exc
