"""Alembic environment for the decision log, run by ``fastslow.api.store.upgrade`` (no alembic.ini).

The caller hands over an open sync connection in ``config.attributes["connection"]``. For
``alembic revision --autogenerate`` during development, run ``python -m fastslow.api.store._revision MESSAGE``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from fastslow.api.store._models import Base

# Any fixed 64-bit number works; it only has to be the same for every fastslow replica.
_PG_MIGRATION_LOCK = 0x66617374736C6F77  # "fastslow"


def _run() -> None:
    config = context.config
    connection = config.attributes["connection"]
    if connection is None:
        raise RuntimeError("fastslow.api.store migrations run through api.store.upgrade(url), with a connection")
    with connection.begin():
        if connection.dialect.name == "postgresql":
            # Replicas that start together migrate one at a time; the lock ends with the transaction,
            # and PostgreSQL's DDL is transactional, so a waiting replica then sees the new version.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            version_table=config.attributes["version_table"],
            render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
            compare_type=True,
        )
        context.run_migrations()


_run()
