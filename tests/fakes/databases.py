"""Real databases for store tests: a SQLite file per test, and a fresh schema on a real PostgreSQL.

PostgreSQL is at ``FASTSLOW_TEST_POSTGRES_URL`` (default: trust auth on loopback). Where it is
unreachable the PostgreSQL cases skip and say why, except under ``CI``, where they fail: CI
always has one, so a skip there would hide a broken setup.

Use the ``database_url`` fixture (parametrized over both) by importing it into a test module.
"""

from __future__ import annotations

import importlib.util
import os
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

__all__ = [
    "POSTGRES_URL",
    "commits_blocked",
    "database_url",
    "dump_rows",
    "postgres_server",
    "postgres_url_in_schema",
]

# Read at import: the autouse settings fixture clears FASTSLOW_* variables before each test runs.
POSTGRES_URL = os.environ.get("FASTSLOW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@cache
def _postgres_problem() -> str | None:
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed (pip install 'fastslow[postgres]')"
    server = make_url(POSTGRES_URL).set(drivername="postgresql+psycopg")
    engine = create_engine(server, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means "no usable server here"; say which
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return f"PostgreSQL unreachable at {make_url(POSTGRES_URL)!r}: {type(exc).__name__}: {first_line}"
    finally:
        engine.dispose()
    return None


def postgres_server() -> str:
    """The PostgreSQL URL, after skipping (or failing, under CI) when there is no usable server."""
    problem = _postgres_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{problem}; CI must provide PostgreSQL (set FASTSLOW_TEST_POSTGRES_URL)", pytrace=False)
        pytest.skip(f"{problem}; set FASTSLOW_TEST_POSTGRES_URL to run the PostgreSQL cases")
    return POSTGRES_URL


def postgres_url_in_schema(schema: str) -> str:
    """The server's URL with ``search_path`` set to ``schema``: the store's tables land there."""
    url = make_url(postgres_server()).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


@pytest.fixture
def postgres_schema_url() -> Iterator[str]:
    """A URL whose tables live in a fresh schema, dropped after the test."""
    base = postgres_server()
    schema = f"fastslow_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(make_url(base).set(drivername="postgresql+psycopg"))
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield postgres_url_in_schema(schema)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A decision-log URL on an empty database: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'log' / 'fastslow.sqlite3'}"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


def dump_rows(url: str) -> str:
    """Every row of every table, as text: for checking what the database holds, secrets included."""
    from fastslow.api.store._engine import sync_url

    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            out = []
            for table in inspect(connection).get_table_names():
                for row in connection.execute(text(f'SELECT * FROM "{table}"')):
                    out.append(f"{table}: {tuple(row)!r}")
        return "\n".join(out)
    finally:
        engine.dispose()


@contextmanager
def commits_blocked(url: str) -> Iterator[None]:
    """Another connection holds the lock every insert into ``decisions`` needs, until the block ends."""
    from fastslow.api.store._engine import sqlite_path, sync_url

    path = sqlite_path(url)
    if path is not None:
        raw = sqlite3.connect(path, isolation_level=None)
        try:
            raw.execute("BEGIN IMMEDIATE")  # the write lock: inserts wait in their busy timeout
            yield
        finally:
            raw.execute("ROLLBACK")
            raw.close()
        return
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection, connection.begin():
            connection.execute(text("LOCK TABLE decisions IN SHARE ROW EXCLUSIVE MODE"))
            yield
    finally:
        engine.dispose()
