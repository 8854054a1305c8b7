"""``Idempotency-Key``: a client's retry is answered with the first response, and nothing is recorded twice.

    return await idempotent(services, caller, "route", key, http_request, work)

``work(request)`` decides and commits through a ``Unit`` (``request`` is ``None`` without a key):
the route's router records into the unit instead of the log, and ``Unit.commit`` stores every
decision of the request, with its key and the response, in one transaction (docs/store.md). So
a failed commit stores nothing of the request, with or without a key, and the client's 503 is true.

A retry with the same key and the same request gets the stored response with
``Idempotent-Replayed: true``, without an engine call or a record; with another request, a 422
naming the header. Two requests with one key at once: on one replica the second waits for the
first and replays it; on two replicas both decide, the table's primary key lets one commit, and
the other answers with what that one stored. Clients never see a 409 for a request in progress:
waiting costs them less than a retry loop, and nothing needs to be locked before the commit,
so a replica that dies mid-request leaves no key stuck "in progress".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any

from fastapi import Header, Request, Response
from sqlalchemy import Table
from sqlalchemy.exc import SQLAlchemyError

from fastslow.api._compose import keeps_state
from fastslow.api.store import (
    IdempotencyKeyTaken,
    IdempotentRequest,
    Record,
    StoredResponse,
    WriterClosed,
    request_hash,
)
from fastslow.router import Decision, Router, State

from ._errors import ApiError, StoreUnavailable
from ._json import strict_json
from ._services import Services
from .deps import Caller

__all__ = [
    "HEADER",
    "REPLAYED_HEADER",
    "IdempotencyKey",
    "Unit",
    "idempotent",
    "replayed_responses",
]

log = logging.getLogger("fastslow.api")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 255

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        min_length=1,
        max_length=MAX_KEY_CHARS,
        # Printable ASCII; no space at either end, which HTTP strips in transit (the key would change).
        pattern=r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$",
        description=(
            "A key of your choosing (1 to 255 printable ASCII characters, a UUID say) that makes a retry "
            "safe: the same key with the same request, within `store.idempotency_ttl_s` (24 h), is answered "
            "with the first response (header `Idempotent-Replayed: true`) and records nothing; with a "
            "different request it is a 422. Scoped to the API key's tenant and this endpoint."
        ),
    ),
]
"""The ``Idempotency-Key`` header: declared in OpenAPI, and checked (422 naming it) before the route runs."""


def replayed_responses(status: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring the ``Idempotent-Replayed`` header on the ``status`` response."""
    header = {
        "description": "`true` when this is the stored response to an earlier request with the same key.",
        "schema": {"type": "string", "enum": ["true"]},
    }
    return {status: {"headers": {REPLAYED_HEADER: header}}}


class Unit:
    """One request's decisions, gathered from its router and committed together by ``commit``."""

    def __init__(self, router: Router) -> None:
        self._records: list[Record] = []
        self._keeps = keeps_state(router)
        self.router = router.with_sink(self)
        """The request's router: it records into this unit, not the log."""

    def _keeps_state(self, decisions: Sequence[Decision]) -> bool:
        # The task's ``store_state`` policy, as the tenant's sink applies it.
        return all(self._keeps(d.task) for d in decisions)

    async def record(self, decision: Decision, *, state: State) -> None:
        await self.record_many((decision,), state=state)

    async def record_many(self, decisions: Sequence[Decision], *, state: State) -> None:
        self._records.append(Record(decisions=tuple(decisions), state=state, store_state=self._keeps_state(decisions)))

    async def commit(
        self,
        services: Services,
        tenant: str,
        response: Response,
        request: IdempotentRequest | None,
        *,
        extra: Sequence[tuple[Table, Mapping[str, Any]]] = (),
    ) -> Response:
        """Store the request's decisions, the ``extra`` rows (the reviews it opened) and ``request``'s
        key with ``response``, then learn; ``response``.

        Raises:
            StoreUnavailable: the commit failed; nothing of the request was stored (503).
            IdempotencyKeyTaken: another replica committed this key first.
        """
        stored = None if request is None else (response.status_code, bytes(response.body))
        try:
            await services.decisions.record_unit(
                self._records, tenant=tenant, idempotent=request, response=stored, extra=extra
            )
        except (SQLAlchemyError, OSError, WriterClosed) as exc:  # WriterClosed: shutting down
            raise StoreUnavailable() from exc
        # Learning happens here, once per decision, and only now: the unit's router records into the
        # unit, past the tenant router's learning sink, and an example links to its decision's row,
        # which exists from the commit on. A failed commit (raised above) teaches nothing; a replay
        # never gets here. Best effort, as in the sink: the decision is committed and answered.
        for record in self._records:
            for decision in record.decisions:
                if decision.system != 2:
                    continue
                try:
                    await services.learner.learn_from(decision, record.state, tenant=tenant)
                except Exception:
                    log.exception("learning from decision %s failed", decision.id)
        return response


def _replay(stored: StoredResponse, request: IdempotentRequest) -> Response:
    if stored.request_hash != request.request_hash:
        raise ApiError(
            422,
            f"{HEADER} reused with a different request: this key was first sent with another body "
            f"(at {stored.created_at.isoformat()}); use a new key for a new request",
            field=HEADER,
        )
    return Response(
        stored.body, status_code=stored.status, media_type="application/json", headers={REPLAYED_HEADER: "true"}
    )


async def _stored(services: Services, request: IdempotentRequest) -> StoredResponse | None:
    try:
        return await services.decisions.idempotent_response(request)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable() from exc


async def idempotent(
    services: Services,
    caller: Caller,
    endpoint: str,
    key: str | None,
    http_request: Request,
    work: Callable[[IdempotentRequest | None], Awaitable[Response]],
    *,
    path: dict[str, str] | None = None,
) -> Response:
    """``work``'s response, or, for a key seen before, the response stored for it.

    Args:
        endpoint: the operation, part of the key's scope.
        http_request: the request, whose JSON body (parsed, so key order and spacing do not
            matter) and ``path`` ids a retry must repeat.
        work: decides and commits, storing ``request``'s key with its response (``Unit.commit``).
    """
    if key is None:
        return await work(None)
    payload = {"body": await strict_json(http_request), "path": path or {}}
    request = IdempotentRequest(
        tenant=caller.tenant,
        endpoint=endpoint,
        key=key,
        request_hash=request_hash(payload),
        ttl_s=services.settings.store.idempotency_ttl_s,
    )
    async with services.decisions.claims.claim(request):
        stored = await _stored(services, request)
        if stored is not None:
            return _replay(stored, request)
        try:
            return await work(request)
        except IdempotencyKeyTaken:
            # Another replica decided the same request and committed first; ours stored nothing.
            stored = await _stored(services, request)
            if stored is None:  # gone already (expired and pruned in between): nothing to replay
                raise StoreUnavailable("the request's idempotency key changed hands") from None
            return _replay(stored, request)
