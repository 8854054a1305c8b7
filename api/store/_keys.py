"""API keys: made, checked, revoked and listed (``DecisionStore``'s key methods, docs/store.md).

Only a key's sha256 is kept, with a short prefix to tell keys apart; the key itself is shown once,
when it is made. A revocation is announced to every replica (``_revocations``).
"""

from __future__ import annotations

import asyncio
import hmac
import uuid
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from ._codec import KEY_PREFIX, api_key, clean, format_scopes, hash_key, new_key
from ._models import ApiKeyRow
from ._revocations import announce_in, touch_marker
from ._values import DEFAULT_SCOPES, ApiKey

__all__ = ["authenticate", "create_key", "get_key", "list_keys", "revoke_key"]

_MAX_KEY_CHARS = 200
"""Longer is not one of our keys (``fs_`` and 43 characters): refused without hashing it."""


async def create_key(
    sessions: async_sessionmaker[AsyncSession],
    tenant: str,
    *,
    name: str | None,
    now: datetime,
    scopes: Iterable[str] = DEFAULT_SCOPES,
) -> tuple[str, ApiKey]:
    """A new key for ``tenant`` with ``scopes``, and its record; the key is not kept.

    Raises:
        ValueError: an unknown scope, or none.
    """
    stored_scopes = format_scopes(scopes)
    key, prefix, digest = new_key()
    row = ApiKeyRow(
        id=uuid.uuid4().hex,
        tenant=clean(tenant),
        name=None if name is None else clean(name),
        prefix=prefix,
        key_hash=digest,
        created_at=now,
        revoked_at=None,
        scopes=stored_scopes,
    )
    async with sessions.begin() as session:
        session.add(row)
    return key, api_key(row)


async def authenticate(sessions: async_sessionmaker[AsyncSession], key: str, *, include_revoked: bool) -> ApiKey | None:
    """The record of ``key``: ``None`` for an unknown one, and for a revoked one unless ``include_revoked``."""
    if not isinstance(key, str) or not key.startswith(KEY_PREFIX) or len(key) > _MAX_KEY_CHARS:
        return None  # not shaped like one of our keys; the shape is public, no timing to hide
    digest = hash_key(key)
    # The index lookup by hash is not constant-time, but what it could leak is about the hash
    # of the caller's own guess, which says nothing about any key of 256 random bits; the final
    # comparison is constant-time all the same.
    async with sessions() as session:
        row = await session.scalar(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest))
    if row is None or not hmac.compare_digest(row.key_hash, digest):
        return None
    if row.revoked_at is not None and not include_revoked:
        return None
    return api_key(row)


async def revoke_key(
    sessions: async_sessionmaker[AsyncSession], engine: AsyncEngine, key_id: str, *, now: datetime
) -> bool:
    """Revoke the key with this id and announce it; whether it exists."""
    async with sessions.begin() as session:
        live = ApiKeyRow.revoked_at.is_(None)
        await session.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, live).values(revoked_at=now))
        found = await session.scalar(select(ApiKeyRow.id).where(ApiKeyRow.id == key_id))
        if found is not None:
            await announce_in(session)  # every replica drops its cached keys at commit
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if found is not None and database:
        await asyncio.to_thread(touch_marker, Path(database))
    return found is not None


async def get_key(sessions: async_sessionmaker[AsyncSession], key_id: str) -> ApiKey | None:
    """The record of the key with this id, revoked or not; ``None`` when there is none."""
    async with sessions() as session:
        row = await session.scalar(select(ApiKeyRow).where(ApiKeyRow.id == key_id))
    return None if row is None else api_key(row)


async def list_keys(sessions: async_sessionmaker[AsyncSession], tenant: str | None) -> list[ApiKey]:
    """Every key's record, oldest first; only ``tenant``'s when given."""
    query = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
    if tenant is not None:
        query = query.where(ApiKeyRow.tenant == tenant)
    async with sessions() as session:
        return [api_key(row) for row in await session.scalars(query)]
