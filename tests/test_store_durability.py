"""The durability promise at the store level: an acknowledged decision survives ``kill -9``.

A child process records decisions (directly, or through the sink's group-committing writer as the
API does) and prints each id only after recording returned (the acknowledgement); the parent reads
some, kills the child with SIGKILL while it is still writing, reopens the database and finds every
acknowledged decision, distribution included.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fastslow.api.store import DecisionStore
from fastslow.api.store._engine import sqlite_path

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent
KILL_TARGET = REPO_ROOT / "tests" / "fakes" / "kill_target.py"
ACKNOWLEDGED_BEFORE_KILL = 300

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")


def _record_until_killed(url: str, via: str) -> list[str]:
    """Run the child, SIGKILL it mid-stream, and return every id it acknowledged."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, str(KILL_TARGET), url, "4", via],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # A watchdog, so that a child stuck before printing cannot hang the test run.
    watchdog = threading.Timer(120, child.kill)
    watchdog.start()
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.stderr.read() if child.stderr else ""
        acknowledged: list[str] = []
        while len(acknowledged) < ACKNOWLEDGED_BEFORE_KILL:
            line = child.stdout.readline()
            assert line.endswith("\n"), f"the child stopped early: {child.stderr.read() if child.stderr else ''}"
            acknowledged.append(line.strip())
        os.kill(child.pid, signal.SIGKILL)  # mid-stream: four workers are recording right now
        rest, _ = child.communicate(timeout=30)
    finally:
        watchdog.cancel()
    assert child.returncode == -signal.SIGKILL
    # Lines the child flushed before it died were acknowledged too; a torn last line was not.
    acknowledged += [line for line in rest.split("\n")[:-1] if line]
    return acknowledged


@pytest.mark.slow
@pytest.mark.parametrize("via", ["record", "sink"])
async def test_acknowledged_decisions_survive_kill_9(database_url: str, via: str) -> None:  # noqa: F811
    acknowledged = _record_until_killed(database_url, via)

    path = sqlite_path(database_url)
    if path is not None:
        with sqlite3.connect(path) as raw:  # the file opens cleanly after the kill, WAL replayed
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        raw.close()
    async with await DecisionStore.open(database_url) as store:
        missing = []
        for decision_id in acknowledged:
            stored = await store.get(decision_id, tenant="durable")
            if stored is None or stored.answers != {"yes": 0.9, "no": 0.1}:
                missing.append(decision_id)
    assert missing == [], f"{len(missing)} of {len(acknowledged)} acknowledged decisions were lost"
