"""The command line loads what a command needs only when it runs: building ``fastslow`` stays light."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fastslow.policies
from fastslow.api.cli import _init

REPO = Path(__file__).resolve().parent.parent

# What the commands load when they run, never when the command line is built (so that `fastslow
# --help` or a mistyped option answers at once). rich is on the list although typer draws its help
# with it: typer imports rich only to format help or an error, not on import or to build the
# command, so this check holds rich to our own lazy imports (keys list, db prune, data convert).
HEAVY = (
    "fastslow.router",
    "fastslow.engines",
    "fastslow.policies",
    "fastslow.graphs",
    "fastslow.api._compose",
    "fastslow.api.app",
    "fastslow.api.store",
    "sqlalchemy",
    "alembic",
    "fastapi",
    "starlette",
    "uvicorn",
    "rich",
    "numpy",
    "matplotlib",
    "langgraph",
    "langchain_core",
    "openai",
    "anthropic",
)


def test_building_the_command_line_loads_no_engine_graph_database_or_web_layer() -> None:
    # A fresh interpreter: this test process has long since imported everything.
    code = (
        "import sys\n"
        "import typer.main\n"
        "from fastslow.api.cli import app\n"
        "typer.main.get_command(app)  # every command and option built, as `fastslow` does before it parses\n"
        f"heavy = {HEAVY!r}\n"
        "loaded = {m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in heavy)}\n"
        "print(sorted(h for h in heavy if h in loaded)); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_init_writes_the_file_name_the_policies_look_for() -> None:
    # init's default path is written out, not imported, to keep the policies out of the start.
    assert _init.POLICY_FILE_NAME == fastslow.policies.POLICY_FILE_NAME


def test_keys_create_on_a_migrated_log_loads_neither_langgraph_nor_alembic(tmp_path: Path) -> None:
    # The quick commands (bench/cli_startup.py times them) must not pay for the graph nodes (LangGraph
    # and LangSmith's tracers, about half a second) or for Alembic when the log is already migrated.
    code = (
        "import sys\n"
        "from fastslow.api.cli import app\n"
        "try:\n"
        "    app(['keys', 'create', '--tenant', 'demo'])\n"
        "except SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "heavy = ('langgraph', 'langsmith', 'alembic', 'fastslow.router._nodes')\n"
        "loaded = sorted(h for h in heavy if h in sys.modules)\n"
        "print(loaded, file=sys.stderr); sys.exit(1 if loaded else 0)"
    )
    env = {**os.environ, "FASTSLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'log.db'}"}
    first = subprocess.run(  # the first command migrates the new log (and may load Alembic to do it)
        [sys.executable, "-m", "fastslow.api.cli", "keys", "create", "--tenant", "demo"], env=env, capture_output=True
    )
    assert first.returncode == 0, first.stderr
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
