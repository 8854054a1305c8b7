"""What the two ``DecisionEngine``s on the official ``openai`` SDK share: the client, ``decide`` and ``aclose``.

``LogprobEngine`` and ``OpenAIDecisionsEngine`` differ only in how one request of questions is
asked and read back (``_ask``). Building the SDK client (the reply cap, the one retry loop), the
whole call's deadline, translating the SDK's errors, splitting what exceeds the engine's limits and
closing the client are the same for both, and live here once. (The System-2 chat engines on the
same SDK share theirs in ``fastslow.engines.chat``'s ``OpenAISdkEngine``.)
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Generic, Protocol, TypeVar

import httpx2
import openai
from pydantic import SecretStr

from fastslow.router import Image, InvalidRequest, Question, ReadOptions, State
from fastslow.router.engine_api import Deadline, EngineLimits, EngineReply, neutralise, split_and_ask

from ._http_limits import DEFAULT_MAX_REPLY_BYTES, capped_client
from ._sdk_errors import api_key_or_deferred_error, openai_errors

__all__ = ["OpenAISdkDecisionEngine", "SdkSettings"]


class SdkSettings(Protocol):
    """The settings every OpenAI-SDK engine reads (``LogprobSettings``, ``OpenAIDecisionsSettings``)."""

    @property
    def model(self) -> str: ...
    @property
    def base_url(self) -> str | None: ...
    @property
    def api_key(self) -> SecretStr | None: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def max_retries(self) -> int: ...


SettingsT = TypeVar("SettingsT", bound=SdkSettings)


class OpenAISdkDecisionEngine(abc.ABC, Generic[SettingsT]):
    """A ``DecisionEngine`` whose requests go through one ``openai.AsyncOpenAI`` client.

    Args:
        settings: endpoint, model, key, time budget and retries.
        name: the engine's name, in answers and errors.
        limits: what one request takes; ``decide`` splits larger calls to fit.
        key_setting: the setting a missing key names (``logprob.api_key``).
        key_env: the environment variable the key falls back to; without one, a missing key is
            sent as a placeholder (servers without auth ignore it).
        max_images: the most images one call may carry (``None``: as ``limits`` allow).
        http_client: an ``httpx2.AsyncClient`` to send requests through (tests pass one with a
            ``MockTransport``). The caller keeps ownership: ``aclose`` leaves it open, and the
            client is used as it is, without the reply cap.
        max_reply_bytes: the largest reply body the engine's own client reads
            (``limits.max_engine_reply_bytes``); a longer one is an ``EngineProtocolError``.

    Subclasses implement ``_ask``: one request of questions that fits ``limits``.
    """

    name: str
    limits: EngineLimits

    def __init__(
        self,
        settings: SettingsT,
        *,
        name: str,
        limits: EngineLimits,
        key_setting: str,
        key_env: str | None = None,
        max_images: int | None = None,
        http_client: httpx2.AsyncClient | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self.name = name
        self.limits = limits
        self._settings = settings
        self._max_images = max_images
        self._owns_http = http_client is None
        self._client = openai.AsyncOpenAI(
            api_key=api_key_or_deferred_error(settings.api_key, setting=key_setting, env=key_env),
            base_url=settings.base_url,
            # The SDK's own client class keeps its connection limits and redirects; the SDK closes it.
            http_client=http_client
            if http_client is not None
            else capped_client(max_reply_bytes, engine=name, factory=openai.DefaultAsyncHttpxClient),
            # The SDK carries the one retry loop (with backoff honouring Retry-After); we add none.
            max_retries=settings.max_retries,
            timeout=settings.timeout_s,
        )

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """Answer every question about ``state`` in as few requests as the engine's limits allow.

        The call's budget (``options.timeout_s``, else the settings' ``timeout_s``) is a deadline for
        the whole call, retries and every byte of each reply included (the SDK's ``timeout`` is per
        read, which a trickling server would never trip). Raises ``EngineError`` subclasses for
        transport, status and body failures, and ``InvalidRequest`` for more images than the engine
        takes.
        """
        if self._max_images is not None and len(images) > self._max_images:
            raise InvalidRequest("images", f"at most {self._max_images} images per request, got {len(images)}")
        opts = options or ReadOptions()
        budget = opts.timeout_s if opts.timeout_s is not None else self._settings.timeout_s
        async with openai_errors(self.name, budget) as deadline:
            return await split_and_ask(
                partial(self._ask, deadline=deadline),
                self.limits,
                neutralise(state),
                questions,
                images=images,
                options=opts,
                engine=self.name,
            )

    async def aclose(self) -> None:
        """Close the SDK client's connections, unless the HTTP client was passed in."""
        if self._owns_http:
            await self._client.close()

    @abc.abstractmethod
    async def _ask(
        self,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],
        options: ReadOptions,
        *,
        deadline: Deadline,
    ) -> EngineReply:
        """One request: ``questions`` (within ``limits``) about ``state``, before ``deadline``."""
