"""Write a new migration from the difference between the models and the newest migration.

Development only:

    python -m fastslow.api.store._revision "add a column" [--url DATABASE_URL]

Without ``--url`` the comparison runs against a scratch SQLite file brought to the newest
migration; pass a PostgreSQL URL (an empty database) to compare against PostgreSQL's types too.
Review the generated file: autogenerate misses renames and some type changes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from alembic import command
from alembic.script import ScriptDirectory

from ._engine import _sync_engine, alembic_config, upgrade


def _next_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    return f"{int(head or 0) + 1:04d}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fastslow.api.store._revision")
    parser.add_argument("message")
    parser.add_argument("--url", help="database to compare against (default: a scratch SQLite file)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        url = args.url or f"sqlite:///{Path(scratch) / 'head.sqlite3'}"
        upgrade(url)
        engine = _sync_engine(url)
        try:
            with engine.connect() as connection:
                command.revision(
                    alembic_config(connection), message=args.message, autogenerate=True, rev_id=_next_revision()
                )
        finally:
            engine.dispose()


if __name__ == "__main__":
    main()
