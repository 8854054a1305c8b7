"""``POST /v1/systemone``: a Jev-compatible gateway over the configured System-1 engine.

Answers come back in Jev's exact response shape, so the official ``typesafe-sdk`` works against
fastslow unchanged: JSON bodies, ``Content-Encoding: zstd`` (decoded by the body middleware) and
multipart bodies with image parts. Images reach engines that take them; other engines get a 422
naming ``assets`` before any work is done. The request's ``model`` is accepted and ignored: the
configured engine answers, and its model is what the response names. Gateway calls are not
decisions (no policy applies), so nothing is written to the decision log.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastslow.router import EngineError, EngineTimeout, InvalidRequest
from fastslow.router.engine_api import budget_s, parse_systemone_request, render_systemone_reply

from ._assets import Part, read_assets
from ._errors import ERROR_RESPONSES, ApiError
from ._jev_schemas import SYSTEMONE_REQUEST_BODY, SystemOneResponse
from ._json import StrictJsonRoute, parse_json_body, strict_json
from .deps import CheckerDep, ServicesDep

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["Jev gateway"], route_class=StrictJsonRoute)

REQUEST_ID_HEADER = "x-typesafe-request-id"
_MAX_PARTS = 64


async def _multipart(request: Request, max_bytes: int, max_depth: int) -> tuple[Any, dict[str, Part]]:
    try:
        async with request.form(max_files=_MAX_PARTS, max_fields=_MAX_PARTS, max_part_size=max_bytes) as form:
            body: Any = None
            parts: dict[str, Part] = {}
            for name, value in form.multi_items():
                if name == "request":
                    raw = await value.read() if isinstance(value, UploadFile) else value
                    body = parse_json_body(raw, max_depth=max_depth, root="request")
                elif isinstance(value, UploadFile):
                    parts[name] = (value.content_type or "", await value.read())
                else:
                    raise InvalidRequest(name, "asset parts must be file parts (with a filename), holding the image")
    except StarletteHTTPException as exc:  # a malformed multipart body
        raise ApiError(422, f"malformed multipart body: {exc.detail}", field="body") from None
    if body is None:
        raise InvalidRequest("request", "a multipart body needs a part named request holding the JSON")
    return body, parts


@router.post(
    "/systemone",
    summary="Answer typed questions (Jev-compatible)",
    response_model=SystemOneResponse,
    responses={**ERROR_RESPONSES, 415: {"description": "Unsupported Content-Type or Content-Encoding."}},
    openapi_extra=SYSTEMONE_REQUEST_BODY,
)
async def system_one(request: Request, services: ServicesDep, _caller: CheckerDep) -> JSONResponse:
    """Jev's ``/v1/systemone``: named questions about one state, answered by the configured System-1 engine."""
    settings = services.settings
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media == "multipart/form-data":
        body, parts = await _multipart(request, settings.max_body_bytes, settings.limits.max_depth)
    elif media == "application/json" or media.endswith("+json"):
        body, parts = await strict_json(request), {}  # parsed already by the route, for JSON types
    else:
        raise ApiError(415, f"unsupported Content-Type {media!r}; send application/json or multipart/form-data")
    # Every limit is checked here, before an engine sees anything.
    parsed = parse_systemone_request(body, max_state_chars=settings.max_state_chars, limits=settings.limits)
    images = read_assets(body.get("assets"), parts)
    # Through its admission gate, as every decision is: a full queue is a 503, not a wait.
    engine = services.engines.engine_for(None, services.runtime.store.current)
    if images and not engine.limits.accepts_images:
        raise InvalidRequest("assets", f"the configured engine {engine.name!r} does not take images")
    # No policy gives the gateway a budget: the settings do, and the engine stops at it (503).
    budget = min(parsed.options.timeout_s or math.inf, settings.limits.gateway_timeout_s)
    options = replace(parsed.options, timeout_s=budget)
    try:
        try:
            async with asyncio.timeout(budget_s(budget)):  # for engines that do not keep their budget
                reply = await engine.decide(parsed.state, parsed.questions, images=images, options=options)
        except TimeoutError:
            raise EngineTimeout(f"no answer within {budget:g} s", engine=engine.name) from None
    except EngineError as exc:
        kind = "timeout" if isinstance(exc, EngineTimeout) else "error"
        services.metrics.observe_engine_call(engine.name, None, error=kind)
        raise
    services.metrics.observe_engine_call(engine.name, reply.latency_ms)
    # Jev's body has no id; its request id travels in this header (the SDK's ``response.request_id``).
    headers = {REQUEST_ID_HEADER: uuid.uuid4().hex}
    return JSONResponse(render_systemone_reply(reply, parsed.questions), headers=headers)
