"""The public surface: one ``fastslow`` namespace, each package's ``__all__`` sorted and real, lazy roots."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import warnings
from pathlib import Path
from typing import get_args

import pytest

import fastslow
from fastslow.router import Reason

REPO = Path(__file__).resolve().parent.parent

PACKAGES = [
    "fastslow",
    "fastslow.router",
    "fastslow.router.engine_api",
    "fastslow.router.graph_api",
    "fastslow.router.settings",
    "fastslow.engines",
    "fastslow.engines.chat",
    "fastslow.engines.embedded",
    "fastslow.engines.embedded.tools",
    "fastslow.engines.jev",
    "fastslow.policies",
    "fastslow.policies.evaluation",
    "fastslow.graphs",
    "fastslow.api",
    "fastslow.api.app",
    "fastslow.api.console",
    "fastslow.api.store",
]
BARE = ("router", "engines", "policies", "graphs", "api")
DOORS = {
    # Each door's docstring names its audience in its opening paragraphs.
    "fastslow": "graph authors",
    "fastslow.router": "policy and graph authors",
    "fastslow.router.engine_api": "engine authors",
    "fastslow.router.settings": "operators",
    "fastslow.router.graph_api": "authors of graph integrations",
    "fastslow.engines.embedded.tools": "offline scripts",
}


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then everything else, each alphabetical.
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
    return kind, name


@pytest.mark.parametrize("package", PACKAGES)
def test_all_names_exist_and_are_sorted(package: str) -> None:
    module = importlib.import_module(package)
    names = list(module.__all__)
    assert names, f"{package} documents no public API"
    assert module.__doc__ and module.__doc__.strip(), f"{package} has no docstring saying what it is for"
    assert len(names) == len(set(names))
    assert names == sorted(names, key=_isort_key), f"{package}.__all__ is not sorted"
    for name in names:
        assert getattr(module, name) is not None, f"{package}.__all__ names {name}, which is None"


@pytest.mark.parametrize("package", PACKAGES[1:])
def test_public_attributes_are_exported(package: str) -> None:
    module = importlib.import_module(package)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith(package + ".")
    }
    assert public <= set(module.__all__)


def test_the_root_gives_what_an_agent_author_needs() -> None:
    from fastslow.api import Runtime, build_runtime
    from fastslow.router import (
        Choice,
        Decision,
        Noul,
        Router,
        Score,
        Settings,
        classify_node,
        get_settings,
        policy_gate_node,
        router_node,
    )

    for value in (Choice, Decision, Noul, Router, Score, Settings, Runtime, build_runtime):
        assert getattr(fastslow, value.__name__) is value
    for node in (classify_node, policy_gate_node, router_node, get_settings):
        assert getattr(fastslow, node.__name__) is node
    assert fastslow.__version__
    assert set(fastslow.__all__) <= set(dir(fastslow))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = fastslow.nope  # type: ignore[attr-defined]


@pytest.mark.parametrize(("door", "audience"), DOORS.items())
def test_each_door_says_who_it_is_for(door: str, audience: str) -> None:
    doc = importlib.import_module(door).__doc__ or ""
    opening = " ".join(" ".join(doc.split("\n\n")[:2]).split()).lower()
    assert audience in opening, f"{door}'s docstring does not say it is for {audience}"


def _moved() -> dict[str, str]:
    return fastslow.router._MOVED


@pytest.mark.parametrize("name", sorted(_moved()))
def test_a_name_that_left_the_router_warns_and_is_the_same_object(name: str) -> None:
    home = _moved()[name]
    assert name not in fastslow.router.__all__ and name in importlib.import_module(home).__all__
    with pytest.warns(DeprecationWarning, match=f"fastslow.router.{name} is deprecated.*import it from {home}$"):
        value = getattr(fastslow.router, name)
    assert value is getattr(importlib.import_module(home), name)


def test_an_import_statement_of_a_moved_name_warns_too() -> None:
    from fastslow.router.settings import JevSettings as current

    with pytest.warns(DeprecationWarning, match="fastslow.router.settings"):
        from fastslow.router import JevSettings
    assert JevSettings is current
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from fastslow.router import Settings  # a name that stayed: no warning

    assert Settings is fastslow.router.settings.Settings
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        _ = fastslow.router.Nope


def _engines_imports() -> dict[str, set[str]]:
    # What engines/ imports from the kernel, by module: fastslow.router and its public modules.
    found: dict[str, set[str]] = {}
    for path in (REPO / "engines").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastslow.router"):
                found.setdefault(node.module or "", set()).update(alias.name for alias in node.names)
    return found


def test_the_engine_api_gives_everything_the_shipped_engines_take_from_the_kernel() -> None:
    # Engines read settings from the settings door, and everything else is in the engine API, so a
    # third-party engine needs no other door.
    from fastslow.router import engine_api, settings

    imports = _engines_imports()
    assert set(imports) <= {"fastslow.router", "fastslow.router.engine_api", "fastslow.router.settings"}
    missing = imports["fastslow.router"] - set(engine_api.__all__) - set(settings.__all__)
    assert not missing, f"engines/ takes {sorted(missing)} from fastslow.router, not in its engine_api"
    assert {"ReadOptions", "Signals", "budget_s", "request_scope", "failure_summary"} <= set(engine_api.__all__)
    for name in set(engine_api.__all__) & set(fastslow.router.__all__):
        assert getattr(engine_api, name) is getattr(fastslow.router, name)


def test_the_settings_door_has_every_settings_type() -> None:
    from fastslow.router import _settings, settings

    assert settings.__all__ == _settings.__all__
    assert (fastslow.router.Settings, fastslow.router.get_settings) == (settings.Settings, settings.get_settings)


def test_the_root_names_match_its_type_checking_imports() -> None:
    # The lazy names are declared twice (for type checkers, and for __getattr__): keep them one set.
    tree = ast.parse((REPO / "__init__.py").read_text())
    guarded = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert guarded == set(fastslow.__all__)


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter: this test process has long since imported everything.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=REPO)


def test_the_kernel_loads_no_sibling_and_no_web_or_database_layer() -> None:
    code = (
        "import sys, fastslow.router, fastslow.router.engine_api, fastslow.router.settings, fastslow.router.graph_api\n"
        "siblings = ('fastslow.engines', 'fastslow.policies', 'fastslow.graphs', 'fastslow.api')\n"
        "heavy = ('fastapi', 'starlette', 'sqlalchemy', 'alembic', 'uvicorn')\n"
        "bad = sorted(m for m in sys.modules if m.startswith(siblings) or m.split('.')[0] in heavy)\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = _fresh(code)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_runtime_loads_neither_fastapi_nor_sqlalchemy() -> None:
    code = (
        "import sys; from fastslow import build_runtime, router_node\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'sqlalchemy', 'alembic'))\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = _fresh(code)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_install_exposes_the_fastslow_name_only(tmp_path: Path) -> None:
    # From a neutral folder, as a user's script runs: none of the generic names is importable.
    code = (
        "import importlib.util\n"
        f"print([n for n in {BARE!r} if importlib.util.find_spec(n) is not None], "
        "importlib.util.find_spec('fastslow') is not None)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert done.stdout.strip() == "[] True"


def test_no_module_is_loaded_under_a_bare_name() -> None:
    # Import everything the suite could, then look: each module is known by its fastslow. name only.
    for package in PACKAGES:
        importlib.import_module(package)
    assert not [name for name in sys.modules if name.split(".")[0] in BARE]
    assert {Path(p).resolve() for p in sys.path if p}.isdisjoint({REPO})


def test_every_reason_is_one_the_router_gives() -> None:
    # Dead values in the Reason literal would be documented outcomes that never happen.
    sources = "".join(p.read_text() for p in (REPO / "router").glob("*.py") if p.name != "_decisions.py")
    decisions = (REPO / "router" / "_decisions.py").read_text()
    body = decisions.split("Reason: TypeAlias = Literal[", 1)[1].split("]", 1)[1]
    for reason in get_args(Reason):
        assert f'"{reason}"' in body or f'"{reason}"' in sources, f"Reason {reason!r} is never produced"
