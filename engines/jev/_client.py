"""``JevEngine``: a ``DecisionEngine`` over any server speaking Jev's ``/v1/systemone``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Literal

import httpx2

from fastslow.engines._http_limits import DEFAULT_MAX_REPLY_BYTES
from fastslow.router import EngineProtocolError, Image, JevSettings, Question, ReadOptions, State
from fastslow.router.engine_api import Deadline, EngineLimits, EngineReply, split_and_ask, validate_state

from ._http import post_with_retries
from ._profiles import PROFILES, JevProfile
from ._wire import build_request, encode_body, parse_reply

__all__ = ["MULTIPART_THRESHOLD_BYTES", "JevEngine"]

MULTIPART_THRESHOLD_BYTES = 256 * 1024
"""With ``image_upload="auto"``, images this large in total go as multipart parts, not base64 JSON."""

_USER_AGENT = "fastslow/0.1 (jev wire client)"


class JevEngine:
    """System-1 decisions from a Jev-shaped server (profile from ``settings.profile``).

    One ``httpx2.AsyncClient`` is reused for every call (pass ``http_client`` to share one; the
    engine then leaves closing it to you). Each ``decide`` call has one time budget
    (``ReadOptions.timeout_s``, else ``settings.timeout_s``) shared by every request it makes,
    retries and the requests of a split included; it bounds each whole exchange, so a server
    trickling its reply is cut off at the deadline. Reply bodies over ``max_reply_bytes`` are
    refused (``EngineProtocolError``), whichever client sends.

    Args:
        settings: server URL, profile, key, model, budget and retries.
        http_client: an existing client to send through.
        image_upload: how Jev ``assets`` travel: base64 in the JSON body, as multipart parts, or
            ``auto`` (multipart from ``MULTIPART_THRESHOLD_BYTES`` of image data).
        max_reply_bytes: the largest reply body read (``limits.max_engine_reply_bytes``).
    """

    name: str
    limits: EngineLimits

    def __init__(
        self,
        settings: JevSettings,
        *,
        http_client: httpx2.AsyncClient | None = None,
        image_upload: Literal["auto", "json", "multipart"] = "auto",
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self.settings = settings
        self.profile: JevProfile = PROFILES[settings.profile]
        self.name = f"jev:{settings.profile}"
        self.limits = self.profile.limits
        self.model: str | None = settings.model or self.profile.default_model
        self.url = settings.base_url.rstrip("/") + self.profile.path
        self._image_upload = image_upload
        self.max_reply_bytes = max_reply_bytes
        self._owns_client = http_client is None
        self._client = http_client or httpx2.AsyncClient(
            timeout=settings.timeout_s,
            limits=httpx2.Limits(max_connections=100, max_keepalive_connections=100, keepalive_expiry=30.0),
        )
        headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
        if settings.api_key is not None and settings.api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._headers = headers

    def __repr__(self) -> str:
        return f"JevEngine(name={self.name!r}, url={self.url!r}, model={self.model!r})"

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """Answer every question about ``state``; see ``fastslow.router.engine_api.DecisionEngine.decide``.

        Raises:
            InvalidRequest: a bad state or question, or images on a profile that takes none.
            EngineHTTPError: the server refused (after retries, for retryable statuses).
            EngineTimeout: the call's budget ran out, mid-reply included.
            EngineUnavailable: the server could not be reached.
            EngineProtocolError: a 2xx reply that is not a Jev reply, or a reply over ``max_reply_bytes``.
        """
        opts = options or ReadOptions()
        validate_state(state)
        budget = opts.timeout_s if opts.timeout_s is not None else self.settings.timeout_s
        deadline = Deadline(budget)

        async def ask(
            part_state: State, part: Mapping[str, Question], part_images: Sequence[Image], part_options: ReadOptions
        ) -> EngineReply:
            return await self._ask(part_state, part, part_images, part_options, deadline)

        return await split_and_ask(
            ask, self.profile.limits, state, questions, images=images, options=opts, engine=self.name
        )

    async def _ask(
        self,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],
        options: ReadOptions,
        deadline: Deadline,
    ) -> EngineReply:
        multipart = self._image_upload == "multipart" or (
            self._image_upload == "auto" and sum(len(i.data) for i in images) >= MULTIPART_THRESHOLD_BYTES
        )
        request = build_request(
            state,
            questions,
            profile=self.profile,
            model=self.model,
            options=options,
            images=images,
            multipart=multipart,
        )
        content, content_type = encode_body(request)
        started = time.perf_counter()
        response = await post_with_retries(
            self._client,
            self.url,
            content=content,
            headers={**self._headers, "Content-Type": content_type},
            deadline=deadline,
            max_retries=self.settings.max_retries,
            engine=self.name,
            max_reply_bytes=self.max_reply_bytes,
        )
        latency_ms = (time.perf_counter() - started) * 1000.0
        try:
            payload = json.loads(response.content)
        except ValueError as exc:
            snippet = response.content[:200].decode("utf-8", errors="replace")
            message = f"HTTP {response.status_code} reply is not JSON: {snippet!r}"
            raise EngineProtocolError(message, engine=self.name) from exc
        return parse_reply(
            payload,
            request,
            engine=self.name,
            latency_ms=latency_ms,
            server_labels=self.profile.name == "structured",
        )

    async def aclose(self) -> None:
        """Close the HTTP client if this engine created it."""
        if self._owns_client:
            await self._client.aclose()
