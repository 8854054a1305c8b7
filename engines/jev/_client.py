"""``JevEngine``: a ``DecisionEngine`` over any server speaking Jev's ``/v1/systemone``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Literal

import httpx2

from fastslow.engines._aiohttp_net import aiohttp_transport
from fastslow.engines._http_limits import DEFAULT_MAX_REPLY_BYTES
from fastslow.router import EngineProtocolError, Image, Question, ReadOptions, State
from fastslow.router.engine_api import (
    Deadline,
    EngineLimits,
    EngineReply,
    ask_whole_sync,
    split_and_ask,
    validate_state,
)
from fastslow.router.settings import JevSettings

from ._http import client_headers, post_with_retries, post_with_retries_sync
from ._profiles import PROFILES, JevProfile
from ._wire import WireRequest, build_request, encode_body, parse_reply

__all__ = ["MULTIPART_THRESHOLD_BYTES", "JevEngine"]

MULTIPART_THRESHOLD_BYTES = 256 * 1024
"""With ``image_upload="auto"``, images this large in total go as multipart parts, not base64 JSON."""

_USER_AGENT = "fastslow/0.1 (jev wire client)"
_JSON = "application/json"
_POOL = httpx2.Limits(max_connections=100, max_keepalive_connections=100, keepalive_expiry=30.0)


class JevEngine:
    """System-1 decisions from a Jev-shaped server (profile from ``settings.profile``).

    One ``httpx2.AsyncClient`` is reused for every call (pass ``http_client`` to share one; the
    engine then leaves closing it to you), and for sync callers (``decide_sync``) one
    ``httpx2.Client``, made on first use unless ``sync_http_client`` is given. Each ``decide`` call has one time budget
    (``ReadOptions.timeout_s``, else ``settings.timeout_s``) shared by every request it makes,
    retries and the requests of a split included; it bounds each whole exchange, so a server
    trickling its reply is cut off at the deadline. Reply bodies over ``max_reply_bytes`` are
    refused (``EngineProtocolError``), whichever client sends.

    Args:
        settings: server URL, profile, key, model, budget and retries.
        http_client: an existing client to send through.
        sync_http_client: an existing sync client for ``decide_sync``; with ``http_client`` but
            without it, sync callers are answered through ``decide`` instead.
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
        sync_http_client: httpx2.Client | None = None,
        image_upload: Literal["auto", "json", "multipart"] = "auto",
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self.settings = settings
        self.profile: JevProfile = PROFILES[settings.profile]
        self.name = f"jev:{settings.profile}"
        # gen_ai.provider.name on its spans: the structured profile is vLLM's structured-reads server.
        self.provider = "vllm" if settings.profile == "structured" else settings.profile
        self.limits = self.profile.limits
        self.model: str | None = settings.model or self.profile.default_model
        self.url = settings.base_url.rstrip("/") + self.profile.path
        self._image_upload = image_upload
        self.max_reply_bytes = max_reply_bytes
        self._owns_client = http_client is None
        self._client = http_client or httpx2.AsyncClient(timeout=settings.timeout_s, transport=aiohttp_transport(_POOL))
        # A sync client of our own only beside an async one of our own: a caller's client may carry
        # a transport, proxies or certificates that a client made here would not have.
        self._owns_sync_client = http_client is None and sync_http_client is None
        self._sync_client = sync_http_client
        self._sync_lock = threading.Lock()
        headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
        if settings.api_key is not None and settings.api_key.get_secret_value():
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._headers = headers
        self._target = httpx2.URL(self.url)
        self._json_headers = client_headers(self._client, {**headers, "Content-Type": _JSON})
        self._sync_json_headers: httpx2.Headers | None = None

    def __repr__(self) -> str:
        return f"JevEngine(name={self.name!r}, url={self.url!r}, model={self.model!r})"

    def _sync(self) -> tuple[httpx2.Client, httpx2.Headers] | None:
        if self._sync_json_headers is None and (self._sync_client is not None or self._owns_sync_client):
            with self._sync_lock:
                if self._sync_client is None:
                    self._sync_client = httpx2.Client(timeout=self.settings.timeout_s, limits=_POOL)
                self._sync_json_headers = client_headers(self._sync_client, {**self._headers, "Content-Type": _JSON})
        if self._sync_client is None or self._sync_json_headers is None:
            return None
        return self._sync_client, self._sync_json_headers

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
        deadline = self._deadline(opts)

        async def ask(
            part_state: State, part: Mapping[str, Question], part_images: Sequence[Image], part_options: ReadOptions
        ) -> EngineReply:
            request, content, headers = self._request(part_state, part, part_images, part_options, self._json_headers)
            started = time.perf_counter()
            response = await post_with_retries(
                self._client,
                self._target,
                content=content,
                headers=headers,
                deadline=deadline,
                max_retries=self.settings.max_retries,
                engine=self.name,
                max_reply_bytes=self.max_reply_bytes,
            )
            return self._reply(response, request, started)

        return await split_and_ask(
            ask, self.profile.limits, state, questions, images=images, options=opts, engine=self.name
        )

    def decide_sync(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply | None:
        """``decide`` from sync code, over a sync client in the calling thread (``SyncDecisionEngine``).

        ``None`` (await ``decide`` instead) for images, for a request the profile's limits would
        split, and when the engine was given an async client but no ``sync_http_client``.
        """
        sync = self._sync()
        if sync is None or images:
            return None
        client, json_headers = sync
        opts = options or ReadOptions()
        validate_state(state)
        deadline = self._deadline(opts)

        def ask(
            part_state: State, part: Mapping[str, Question], part_images: Sequence[Image], part_options: ReadOptions
        ) -> EngineReply:
            request, content, headers = self._request(part_state, part, part_images, part_options, json_headers)
            started = time.perf_counter()
            response = post_with_retries_sync(
                client,
                self._target,
                content=content,
                headers=headers,
                deadline=deadline,
                max_retries=self.settings.max_retries,
                engine=self.name,
                max_reply_bytes=self.max_reply_bytes,
            )
            return self._reply(response, request, started)

        return ask_whole_sync(ask, self.profile.limits, state, questions, options=opts, engine=self.name)

    def _deadline(self, options: ReadOptions) -> Deadline:
        return Deadline(options.timeout_s if options.timeout_s is not None else self.settings.timeout_s)

    def _request(
        self,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],
        options: ReadOptions,
        json_headers: httpx2.Headers,
    ) -> tuple[WireRequest, bytes, Mapping[str, str]]:
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
        if content_type == _JSON:
            return request, content, json_headers
        return request, content, {**self._headers, "Content-Type": content_type}

    def _reply(self, response: httpx2.Response, request: WireRequest, started: float) -> EngineReply:
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
        """Close the HTTP clients this engine created."""
        if self._owns_client:
            await self._client.aclose()
        if self._owns_sync_client and self._sync_client is not None:
            self._sync_client.close()
