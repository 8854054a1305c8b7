"""What both OpenAI engines share: one SDK client per engine, built from the settings."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx2
import openai

from router import EngineProtocolError, System2Settings

from ._ref import ModelRef

__all__ = ["OpenAISdkEngine"]

logger = logging.getLogger(__name__)


class OpenAISdkEngine:
    """Holds the ``openai.AsyncOpenAI`` client, the model, its price and the time budget.

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
