"""Database URLs, engines and migrations for the decision log.

SQLite (the default, one file under the data directory) and PostgreSQL are supported. The same
URL works for both the async engine the store uses and the sync engine Alembic migrates with:
``sqlite+aiosqlite`` / ``sqlite`` and ``postgresql+psycopg`` / ``postgresql`` are mapped to the
right driver for each.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fastslow.router import ConfigError, Settings

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "HEAD_REVISION",
    "async_url",
    "create_store_engine",
    "database_url_for",
    "sqlite_path",
    "sync_url",
    "upgrade",
]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
VERSION_TABLE = "fastslow_alembic_version"
"""Our own name, so the log can share a database with an application that also uses Alembic."""
HEAD_REVISION = "0006"
"""The newest migration's revision: a database already there is not handed to Alembic at all (importing
and running it costs a short command such as ``fastslow keys create`` more than half its time).
tests/test_store.py holds it equal to Alembic's own head, so a new migration cannot forget it."""
SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another one (another process, another pooled connection)."""

# Alembic runs env.py through a module-level proxy (``alembic.context``), so two migrations in one
# process at once would trample each other; replicas are separate processes and use the database lock.
_ALEMBIC_LOCK = threading.Lock()

_DRIVER_MODULES = {"sqlite": "aiosqlite", "postgresql": "psycopg"}
_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}
_SYNC_DRIVERS = {"sqlite": "sqlite+pysqlite", "postgresql": "postgresql+psycopg"}


def database_url_for(settings: Settings) -> str:
    """The decision log's URL: ``settings.database_url``, or a SQLite file under the data directory.

    The data directory is ``settings.data_dir`` or the user's data directory, never a path inside
    the installed package; it is created when missing.
    """
    if settings.database_url:
        return settings.database_url
    data_dir = settings.resolved_data_dir().expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite+aiosqlite:///{data_dir / 'fastslow.sqlite3'}"


def _parse(url: str | URL) -> URL:
    try:
        parsed = make_url(url)
    except Exception as exc:  # SQLAlchemy raises ArgumentError with the URL in it; keep secrets out
        raise ConfigError(f"not a valid SQLAlchemy URL ({type(exc).__name__})", key="database_url") from None
    backend = parsed.get_backend_name()
    if backend == "postgres":  # Heroku-style URLs
        backend = "postgresql"
    if backend not in _ASYNC_DRIVERS:
        raise ConfigError(f"unsupported database {backend!r}; use sqlite or postgresql", key="database_url")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        # Each connection would see its own empty database, and every decision would be lost on exit.
        raise ConfigError("the decision log needs a SQLite file, not an in-memory database", key="database_url")
    module = _DRIVER_MODULES[backend]
    if importlib.util.find_spec(module) is None:
        extra = " (pip install 'fastslow[postgres]')" if backend == "postgresql" else ""
        raise ConfigError(f"{backend} needs the {module} package{extra}", key="database_url")
    return parsed


def async_url(url: str | URL) -> URL:
    """The URL with the async driver the store uses (aiosqlite, psycopg)."""
    parsed = _parse(url)
    return parsed.set(drivername=_ASYNC_DRIVERS[_backend(parsed)])


def sync_url(url: str | URL) -> URL:
    """The URL with the sync driver Alembic uses (sqlite3, psycopg)."""
    parsed = _parse(url)
    return parsed.set(drivername=_SYNC_DRIVERS[_backend(parsed)])


def sqlite_path(url: str | URL) -> Path | None:
    """The SQLite file a URL points at, or ``None`` for PostgreSQL."""
    parsed = _parse(url)
    return Path(parsed.database or "") if _backend(parsed) == "sqlite" else None


def _backend(parsed: URL) -> str:
    name = parsed.get_backend_name()
    return "postgresql" if name == "postgres" else name


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers work while one writer commits, and with synchronous=NORMAL a commit survives
    # the process being killed (it is in the WAL file the moment COMMIT returns); only power loss
    # can lose the last commits, which the durability promise leaves out. journal_mode persists in
    # the file; the other pragmas are per connection, hence this hook on every connect.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def _prepare_sqlite_file(path: Path) -> None:
    path.expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)


def create_store_engine(url: str | URL) -> AsyncEngine:
    """The async engine the store runs on, with SQLite's pragmas set on every connection."""
    target = async_url(url)
    path = sqlite_path(target)
    if path is not None:
        _prepare_sqlite_file(path)
        engine = create_async_engine(target)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    # pool_pre_ping: replicas outlive database restarts and failovers without a stale connection error.
    return create_async_engine(target, pool_pre_ping=True)


def _sync_engine(url: str | URL) -> Engine:
    target = sync_url(url)
    path = sqlite_path(target)
    if path is None:
        return create_engine(target)
    _prepare_sqlite_file(path)
    engine = create_engine(target)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def alembic_config(connection: Any = None) -> Config:
    """Alembic's configuration, built in code so migrations run from the installed package (no alembic.ini)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    config.attributes["version_table"] = VERSION_TABLE
    return config


def _at_head(connection: Any) -> bool:
    """Whether the database records the newest migration (read only: no lock, no Alembic)."""
    from sqlalchemy import inspect

    if not inspect(connection).has_table(VERSION_TABLE):
        return False
    versions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    return list(versions) == [HEAD_REVISION]


def upgrade(url: str) -> None:
    """Run the decision log's migrations up to the newest (what ``fastslow db upgrade`` does).

    Safe to run again and from several replicas at once: on PostgreSQL the migration takes an
    advisory lock, so one replica migrates while the others wait and then find nothing to do. A
    database already at the newest revision is left alone without starting Alembic.
    """
    engine = _sync_engine(url)
    try:
        with engine.connect() as connection:
            if _at_head(connection):
                return
        from alembic import command

        with _ALEMBIC_LOCK, engine.connect() as connection:
            command.upgrade(alembic_config(connection), "head")
    finally:
        engine.dispose()
