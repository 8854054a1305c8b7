"""Idempotency keys: a request's key, a hash of what it asked and the response it got (docs/store.md).

The row is written in the same transaction as the request's decisions (``DecisionWriter.record_unit``)
or outcome (``DecisionStore.record_outcome``): a stored response always has its decisions, and a
failed commit leaves neither. The ``(tenant, endpoint, key)`` primary key is what keeps two replicas
from both recording a request: the second commit is refused, and ``IdempotencyKeyTaken`` tells its
caller to answer with what the first stored. Within one replica, ``Claims`` makes a second request
with a key in flight wait for the first instead of deciding (and calling engines) again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ._codec import canonical_state
from ._models import IdempotencyKeyRow

__all__ = [
    "Claims",
    "IdempotencyKeyTaken",
    "IdempotentRequest",
    "StoredResponse",
    "find_response",
    "key_taken",
    "prune_expired_keys",
    "request_hash",
    "response_row",
]


class IdempotencyKeyTaken(Exception):
    """Another request with this key committed first (on another replica): nothing of this one was stored."""


def request_hash(payload: dict[str, Any]) -> str:
    """sha256 hex of ``payload``'s canonical JSON (sorted keys, no spaces): equal requests hash equal.

    As a state's digest is made, without recursion: a body may nest as deep as the API allows.
    """
    return canonical_state(payload)[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class IdempotentRequest:
    """A request sent with an ``Idempotency-Key``, scoped to its tenant and endpoint."""

    tenant: str
    endpoint: str
    """Which operation: ``policy-check``, ``policy-check/batch``, ``route`` or ``outcome``."""
    key: str
    request_hash: str
    ttl_s: float
    """How long the stored response answers retries (``store.idempotency_ttl_s``)."""

    @property
    def scope(self) -> tuple[str, str, str]:
        return (self.tenant, self.endpoint, self.key)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredResponse:
    """What the first request with a key was answered."""

    request_hash: str
    status: int
    body: bytes
    created_at: datetime
    expires_at: datetime


def response_row(request: IdempotentRequest, *, status: int, body: bytes, now: datetime) -> dict[str, Any]:
    """The ``idempotency_keys`` row of a request answered ``status`` with ``body`` (JSON) at ``now``."""
    return {
        "tenant": request.tenant,
        "endpoint": request.endpoint,
        "key": request.key,
        "request_hash": request.request_hash,
        "status": status,
        "body": body.decode("utf-8"),
        "created_at": now,
        "expires_at": now + timedelta(seconds=request.ttl_s),
    }


def _where(request: IdempotentRequest) -> Any:
    return (
        (IdempotencyKeyRow.tenant == request.tenant)
        & (IdempotencyKeyRow.endpoint == request.endpoint)
        & (IdempotencyKeyRow.key == request.key)
    )


async def find_response(
    sessions: async_sessionmaker[AsyncSession], request: IdempotentRequest, now: datetime
) -> StoredResponse | None:
    """The live response stored for ``request``'s key; an expired one is deleted and ``None`` returned."""
    async with sessions() as session:
        row = await session.scalar(select(IdempotencyKeyRow).where(_where(request)))
    if row is None:
        return None
    if row.expires_at <= now:
        # Forgotten: the key is new again. Deleted now, so the new request's insert does not meet it.
        async with sessions.begin() as session:
            await session.execute(delete(IdempotencyKeyRow).where(_where(request), IdempotencyKeyRow.expires_at <= now))
        return None
    return StoredResponse(
        request_hash=row.request_hash,
        status=row.status,
        body=row.body.encode("utf-8"),
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


async def key_taken(sessions: async_sessionmaker[AsyncSession], request: IdempotentRequest) -> bool:
    """Whether a row holds ``request``'s key (after a refused commit: was it the key's primary key?)."""
    async with sessions() as session:
        return await session.scalar(select(IdempotencyKeyRow.key).where(_where(request))) is not None


async def prune_expired_keys(
    sessions: async_sessionmaker[AsyncSession], now: datetime, *, tenant: str | None, dry_run: bool, batch: int
) -> int:
    """Delete (or, in a dry run, count) keys expired at ``now``, ``batch`` at a time; how many."""
    expired = IdempotencyKeyRow.expires_at <= now
    if tenant is not None:
        expired = expired & (IdempotencyKeyRow.tenant == tenant)
    if dry_run:
        async with sessions() as session:
            return int(await session.scalar(select(func.count()).where(expired)) or 0)
    deleted = 0
    while True:
        # Each batch is its own short transaction, as for decisions: the batch's latest expiry is
        # the cut (ties may take a few more rows than ``batch``, never unboundedly many).
        async with sessions() as session:
            expiries = list(
                await session.scalars(
                    select(IdempotencyKeyRow.expires_at)
                    .where(expired)
                    .order_by(IdempotencyKeyRow.expires_at)
                    .limit(batch)
                )
            )
        if not expiries:
            return deleted
        cut = expiries[-1]
        async with sessions.begin() as session:
            result = await session.execute(
                delete(IdempotencyKeyRow).where(expired, IdempotencyKeyRow.expires_at <= cut)
            )
        deleted += int(getattr(result, "rowcount", 0) or 0)


class Claims:
    """The keys this replica's requests are working on: a second request with one waits for the first.

    Not a lock across replicas (the table's primary key is that); it only spares engine calls and
    a refused commit when a client's retry reaches the replica still answering its first try.
    """

    def __init__(self) -> None:
        self._held: dict[tuple[str, str, str], asyncio.Event] = {}

    @asynccontextmanager
    async def claim(self, request: IdempotentRequest) -> AsyncIterator[None]:
        """Hold ``request``'s key for the block, once no other request of this replica holds it."""
        scope = request.scope
        while (other := self._held.get(scope)) is not None:
            await other.wait()
        done = self._held[scope] = asyncio.Event()
        try:
            yield
        finally:
            del self._held[scope]
            done.set()
