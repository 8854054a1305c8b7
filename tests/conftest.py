"""Shared fixtures: a guard against reaching real providers, settings isolation, the public data.

Also the markers that say what a test needs (``pytest_collection_modifyitems``): ``integration`` on
every test of a module that starts a server or a subprocess or opens a database file, and on every
test given the ``database_url`` or ``postgres_schema_url`` fixture; ``postgres`` on those that reach
PostgreSQL. ``make test-fast`` leaves the integration tier (and ``slow``) out.
"""

from __future__ import annotations

import ast
import ipaddress
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fastslow.router import get_settings

if TYPE_CHECKING:
    from fastslow.api.store import DecisionStore

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("FASTSLOW_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))

_BARE = frozenset({"router", "engines", "policies", "graphs", "api"})

_PROVIDER_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "TYPESAFE_API_KEY",
    "TYPESAFE_BASE_URL",
    "OPENROUTER_API_KEY",
)


def _loopback(address: Any) -> bool:
    if not isinstance(address, tuple):
        return True  # AF_UNIX paths and the like never leave the machine
    host = address[0]
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _no_real_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that tries to open a connection beyond loopback (pydantic-ai's ALLOW_MODEL_REQUESTS)."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        if not _loopback(address):
            raise RuntimeError(f"a test tried to reach {address!r}; tests only talk to loopback servers")
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if not _loopback(address):
            raise RuntimeError(f"a test tried to reach {address!r}; tests only talk to loopback servers")
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    for name in _PROVIDER_ENV:
        monkeypatch.delenv(name, raising=False)


# A module importing any of these starts a server (an in-process HTTP fake counts), a subprocess, or
# opens a decision log or database file: its tests are in the integration tier.
_INTEGRATION_IMPORTS = frozenset(
    {
        "subprocess",
        "sqlite3",
        "uvicorn",
        "fakes.anthropic_server",
        "fakes.api_server",
        "fakes.canary",
        "fakes.databases",
        "fakes.jev_server",
        "fakes.kill_target",
        "fakes.langsmith",
        "fakes.openai_server",
        "fakes.otlp",
        "fakes.prometheus",
        "fakes.responses_server",
        "fakes.slow_server",
        "fastslow.api.app",
        "fastslow.api.cli",
        "fastslow.api.store",
        "langgraph.checkpoint.sqlite",
        "langgraph.checkpoint.sqlite.aio",
    }
)
_DATABASE_FIXTURES = frozenset({"database_url", "postgres_schema_url"})
_integration_modules: dict[Path, bool] = {}


def _imports_integration(path: Path) -> bool:
    if path not in _integration_modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
        _integration_modules[path] = not imported.isdisjoint(_INTEGRATION_IMPORTS)
    return _integration_modules[path]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what each test needs: ``integration`` (servers, subprocesses, real databases), ``postgres``."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "postgres_schema_url" in names or params.get("database_url") == "postgresql":
            item.add_marker(pytest.mark.postgres)
        if names & _DATABASE_FIXTURES or _imports_integration(item.path):
            item.add_marker(pytest.mark.integration)


_scopes: dict[str, tuple[set[str], bool]] = {}


def _module_scopes(module: str) -> tuple[set[str], bool]:
    """A test file's functions in an ``xdist_group`` (``{"*"}``: all), and whether it has a module fixture."""
    if module not in _scopes:
        try:
            tree = ast.parse((Path(module)).read_text(encoding="utf-8"))
        except (OSError, SyntaxError):
            _scopes[module] = (set(), False)
            return _scopes[module]
        grouped: set[str] = set()
        shared = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
                if "xdist_group" in ast.unparse(node.value):
                    grouped.add("*")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                if any("xdist_group" in d for d in decorators):
                    grouped.add(node.name)
                if any("fixture" in d and "scope='module'" in d for d in decorators):
                    shared = True
        _scopes[module] = (grouped, shared)
    return _scopes[module]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` that works with this pytest: pytest-xdist 3.8 tags grouped tests by
    rewriting ``item._nodeid``, which pytest 9 no longer reads, so its own loadgroup runs a group's
    tests on any worker. Here the controller reads the test files instead: tests in an
    ``xdist_group`` (the ``timing`` tests) share one worker, as do the tests of a module with a
    module-scoped fixture (its shared server starts once); every other test goes where there is room.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupsAndSharedModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module, _, rest = nodeid.partition("::")
            grouped, shared = _module_scopes(str(config.rootpath / module))
            function = rest.split("[", 1)[0].split("::")[-1]
            if "*" in grouped or function in grouped:
                return "xdist-group"  # every group in this suite is "timing"
            return module if shared else nodeid

    return GroupsAndSharedModules(config, log)


@pytest.fixture(scope="session")
def _embedding_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One embedding cache (and trained-head store) for the whole run, every xdist worker included.

    Set in the environment for the whole session, not only inside each test: a module-scoped server
    starts before its first test's settings fixture, and would otherwise embed and train into the
    user's own cache. The cache writes each entry atomically, so workers can share it;
    ``fakes.embedded.first_build`` lets one of them train the heads while the others wait and load.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Each worker's base temp is <run>/popen-gwN; the run's folder is the same for all of them.
        cache = tmp_path_factory.getbasetemp().parent / "embeddings"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("embeddings")
    with pytest.MonkeyPatch.context() as session_env:
        session_env.setenv("FASTSLOW_EMBEDDED__CACHE_DIR", str(cache))
        yield cache


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[DecisionStore]:
    """The decision log, migrated, on the empty database of the module's ``database_url``.

    For modules that import ``database_url`` from ``fakes.databases``: one definition for every store test.
    """
    from fastslow.api.store import DecisionStore  # here: the unit tier never loads the store

    async with await DecisionStore.open(database_url) as opened:
        yield opened


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, _embedding_cache: Path) -> Iterator[None]:
    """Each test reads settings anew, from its own environment, with data under its tmp_path.

    The embedding cache is one per session, not per test: every API server a test starts would
    otherwise embed the examples and train the heads from nothing.
    """
    for name in list(os.environ):
        if name.startswith("FASTSLOW_") and name != "FASTSLOW_SHARED_DATA":
            monkeypatch.delenv(name)
    monkeypatch.setenv("FASTSLOW_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FASTSLOW_EMBEDDED__CACHE_DIR", str(_embedding_cache))
    monkeypatch.setenv("FASTSLOW_SETTINGS_FILE", str(tmp_path / "no-settings.toml"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(autouse=True, scope="session")
def _one_name_per_module() -> Iterator[None]:
    """After the whole suite: no module was loaded under a bare name (``router``, ``api``, ...).

    fastslow is imported as installed, never from the repository root, so a module cannot load
    twice under two names (two ``ConfigError`` classes that ``except`` would tell apart).
    """
    yield
    bare = sorted(name for name in sys.modules if name.split(".")[0] in _BARE)
    assert not bare, f"modules loaded under a bare name, not fastslow.*: {bare}"


@pytest.fixture
def shared_data() -> Path:
    """The public labelled data sets (../shared/data); skips where that folder is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"public data not found at {SHARED_DATA} (set FASTSLOW_SHARED_DATA); CI always has it")
    return SHARED_DATA
