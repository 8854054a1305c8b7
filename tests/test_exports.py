"""Each package names its public API in __all__, and every name there exists."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PACKAGES = [
    "router",
    "engines",
    "engines.chat",
    "engines.embedded",
    "engines.jev",
    "policies",
    "graphs",
    "api",
    "api.store",
]


@pytest.mark.parametrize("package", PACKAGES)
def test_all_names_exist_and_are_sorted(package: str) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(module, name), f"{package}.__all__ names missing {name}"


@pytest.mark.parametrize("package", PACKAGES)
def test_public_attributes_are_exported(package: str) -> None:
    module = importlib.import_module(package)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", "").startswith(package + ".")
    }
    assert public <= set(module.__all__)


def test_router_imports_none_of_its_siblings() -> None:
    # A fresh interpreter: this test process has long since imported everything.
    code = (
        "import sys, router; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'engines', 'policies', 'graphs', 'api'}); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
