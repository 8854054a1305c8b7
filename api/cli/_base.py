"""What every ``fastslow`` command shares: exit codes, the one-line failure, settings, the decision log.

Bad input ends with one line on stderr naming the field, and a non-zero exit: 2 for a bad request
or configuration, 3 when the engine could not answer, 4 when the decision log's database could not
be reached or migrated, 130 when interrupted. Never a traceback for a user mistake.

Only typer and the standard library load with this module: the kernel, the engines and the database
layer load inside the functions that need them, when a command runs, so that building the command
line (``fastslow --help``) stays quick.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from fastslow.api.store import DecisionStore
    from fastslow.policies import PolicySource
    from fastslow.router import PolicySet, Settings

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_ENGINE",
    "EXIT_INTERRUPTED",
    "EXIT_STORE",
    "POLICY_OPT",
    "TASK_OPT",
    "check_engine",
    "fail",
    "load_settings",
    "policy_source",
    "read_policy",
    "run_store",
    "say_policy",
    "when",
    "write_line",
]

EXIT_BAD_INPUT = 2
EXIT_ENGINE = 3
EXIT_STORE = 4
"""The decision log's database could not be reached or migrated."""
EXIT_INTERRUPTED = 130

# Shared by the commands that read a policy task (calibrate, tune, report drift, report shadow).
POLICY_OPT = typer.Option("--policy", help="The policy file to fit and rewrite.")
TASK_OPT = typer.Option("--task", help="The task to fit.")

_T = TypeVar("_T")


def fail(message: str, code: int) -> NoReturn:
    # One line, no traceback: a person (or a script) reads it.
    sys.stderr.write(f"error: {' '.join(message.split())}\n")
    raise typer.Exit(code)


def check_engine(engine: str | None) -> str | None:
    """A command's ``--engine``, checked against the installed engines, a plugin's too; a bad one is one line."""
    from fastslow.router import installed_engines

    if engine is not None and engine not in (names := installed_engines()):
        fail(
            f"--engine: unknown engine {engine!r}; expected one of the installed engines: {', '.join(names)}",
            EXIT_BAD_INPUT,
        )
    return engine


def load_settings(engine: str | None = None, examples: Path | None = None) -> Settings:
    """The settings, with a command's ``--engine`` and ``--examples`` applied; a bad one is one line."""
    from fastslow.router import get_settings

    try:
        settings = get_settings()
    except Exception as exc:  # pydantic's ValidationError: a bad FASTSLOW_* variable or file
        fail(f"settings: {exc}", EXIT_BAD_INPUT)
    updates: dict[str, Any] = {}
    if engine is not None:
        updates["engine"] = engine
    if examples is not None:
        if not examples.is_file():
            fail(f"--examples: no such file {examples}", EXIT_BAD_INPUT)
        updates["embedded"] = settings.embedded.model_copy(update={"examples": examples})
    return settings.model_copy(update=updates)


def policy_source(settings: Settings, given: Path | None = None) -> PolicySource:
    """The policy a command reads: ``given`` (its ``--policy``), else the one the settings name, the
    working directory's or the built-in one (``locate_policy``); a missing file is one line."""
    from fastslow.policies import PolicySource, locate_policy
    from fastslow.router import ConfigError

    if given is not None:
        if not given.is_file():
            fail(f"--policy: no such file {given}", EXIT_BAD_INPUT)
        return PolicySource(path=given, origin="command line")
    try:
        return locate_policy(settings)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def read_policy(settings: Settings, given: Path | None = None) -> tuple[PolicySource, PolicySet]:
    """The policy a command reads (``policy_source``), loaded and checked as the service loads it;
    a bad file is one line (``file:line: what (key 'k')``) and exit status 2, whichever command reads it."""
    from fastslow.api._compose import policy_loader
    from fastslow.router import ConfigError

    source = policy_source(settings, given)
    try:
        return source, policy_loader(settings)(source.path)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)


def say_policy(source: PolicySource) -> None:
    # On stderr: stdout stays the command's result, for scripts.
    sys.stderr.write(f"policy: {source.describe()}\n")


async def _with_store(settings: Settings, work: Callable[[DecisionStore], Awaitable[_T]]) -> _T:
    from fastslow.api.store import DecisionStore, database_url_for

    store = await DecisionStore.open(database_url_for(settings))
    try:
        return await work(store)
    finally:
        await store.aclose()


def run_store(settings: Settings, work: Callable[[DecisionStore], Awaitable[_T]]) -> _T:
    """Open the decision log (migrating it first), run ``work`` on it, close it; a failure is one line."""
    from sqlalchemy.exc import SQLAlchemyError

    from fastslow.router import ConfigError

    try:
        return asyncio.run(_with_store(settings, work))
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except (SQLAlchemyError, OSError) as exc:
        fail(f"decision log: {type(exc).__name__}: {exc}", EXIT_STORE)


def when(moment: datetime | None) -> str:
    """A time as people and scripts read it in the command's output (empty for none)."""
    return "" if moment is None else moment.isoformat(timespec="seconds")


def write_line(result: dict[str, Any]) -> None:
    """One JSON object on its own line of stdout, flushed."""
    sys.stdout.write(json.dumps(result, ensure_ascii=False) + "\n")
    sys.stdout.flush()  # whoever reads the stream sees each response as soon as it is ready
