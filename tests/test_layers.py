"""What may import what (docs/architecture.md), read from the source: dependencies point one way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

ALLOWED = {
    "router": set(),
    "engines": {"router"},
    "policies": {"router"},
    "graphs": {"router"},
    "api": {"router", "engines", "policies", "graphs"},
}


def _fastslow_imports(path: Path) -> set[str]:
    """The fastslow packages a module imports, by absolute name (relative ones stay in its package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "fastslow" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    wrong = {
        str(path.relative_to(REPO)): sorted(_fastslow_imports(path) - ALLOWED[package] - {package})
        for path in (REPO / package).rglob("*.py")
    }
    assert not {where: what for where, what in wrong.items() if what}, "see docs/architecture.md"


def test_the_root_package_imports_its_subpackages_lazily_only() -> None:
    tree = ast.parse((REPO / "__init__.py").read_text())
    top_level = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert all(not (isinstance(node, ast.ImportFrom) and node.level) for node in top_level)
