"""How a key revocation reaches every replica at once, whatever process revoked it.

Replicas keep the keys they found live for ``auth_cache_s`` (``fastslow.api.app``'s key cache). A
revocation is announced so each replica can drop its cache the moment it happens, not when the
entry expires:

* PostgreSQL: ``pg_notify`` on ``CHANNEL`` inside the revoking transaction, so it is delivered at
  commit (never for a revocation that rolled back) to every replica listening on the database;
* SQLite: replicas share one file on one machine, so a marker file beside the database is replaced
  after the commit, and a replica reads its ``stat`` (a microsecond, no database trip) before
  trusting a cached key.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["CHANNEL", "announce_in", "marker_for", "touch_marker"]

CHANNEL = "fastslow_key_revoked"
"""The PostgreSQL notification channel a revocation is announced on."""


def marker_for(database: Path) -> Path:
    """The marker file a SQLite database's revocations replace."""
    return database.with_name(database.name + ".revocations")


async def announce_in(session: AsyncSession) -> None:
    """On PostgreSQL, queue the notification in ``session``'s transaction (sent when it commits)."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(text("SELECT pg_notify(:channel, '')"), {"channel": CHANNEL})


def touch_marker(database: Path) -> None:
    """Replace the marker file, so its inode and mtime change even within one clock tick."""
    marker = marker_for(database)
    fd, temp = tempfile.mkstemp(dir=marker.parent, prefix=marker.name, suffix=".tmp")
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    os.replace(temp, marker)
