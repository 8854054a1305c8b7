"""Watching for key revocations, so the key cache drops what it holds the moment a key is revoked.

A watch gives a *generation*: a value that changes whenever a key was revoked anywhere (on any
replica, or by ``fastslow keys revoke`` in another process), or ``None`` while this replica cannot
tell (its PostgreSQL listener is reconnecting), when no cached key may be trusted. The store
announces revocations (``fastslow.api.store._revocations``); this side listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

from sqlalchemy.engine import make_url

from fastslow.api.store._engine import sqlite_path
from fastslow.api.store._revocations import CHANNEL, marker_for

__all__ = ["FileRevocations", "PostgresRevocations", "RevocationWatch", "revocation_watch"]

log = logging.getLogger("fastslow.api")

Generation = object
"""Compared for equality only."""
RECONNECT_S = 0.5


class RevocationWatch(Protocol):
    def generation(self) -> Generation | None:
        """Changes after every revocation; ``None`` when revocations cannot be seen right now."""
        ...

    def running(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Watch while the block runs."""
        ...


class FileRevocations:
    """SQLite: the marker file beside the database, replaced on every revocation."""

    def __init__(self, database: Path) -> None:
        self._marker = marker_for(database)

    def generation(self) -> Generation | None:
        try:
            st = os.stat(self._marker)
        except FileNotFoundError:
            return 0  # nothing was ever revoked here
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        yield


class PostgresRevocations:
    """PostgreSQL: ``LISTEN`` on the revocation channel over a connection of its own.

    Until the listener is connected, and whenever its connection drops, the generation is ``None``
    (keys are read from the table on every request); each (re)connection starts a new generation,
    since a notification sent while nobody listened is lost.
    """

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        self._conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        self._generation: int | None = None
        self._epoch = 0
        self.connected = asyncio.Event()
        """Set while listening (tests wait on it)."""

    def generation(self) -> Generation | None:
        return self._generation

    def _bump(self) -> None:
        self._epoch += 1
        self._generation = self._epoch

    async def _listen(self) -> None:
        import psycopg

        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._bump()
                    self.connected.set()
                    async for _notice in conn.notifies():
                        self._bump()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database restarted or the network dropped: keep trying
                log.warning("key revocation listener lost its connection (%s); retrying", type(exc).__name__)
            self._generation = None
            self.connected.clear()
            await asyncio.sleep(RECONNECT_S)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self._listen(), name="fastslow-key-revocations")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self._generation = None


def revocation_watch(url: str) -> RevocationWatch:
    """The watch for the decision log at ``url``."""
    database = sqlite_path(url)
    if database is not None:
        return FileRevocations(database)
    return PostgresRevocations(url)
