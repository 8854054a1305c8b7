"""What may import what (docs/architecture.md), read from the source: dependencies point one way.

Two rules: a package imports only the layers below it (``ALLOWED``), and no module imports another
package's private module (a dotted component starting with ``_`` after the package's name), so
what a sibling or a benchmark needs has a public door. Inside one package, its subpackages may
share private modules. ``bench/`` and the root ``__init__.py`` are outside every package: they
may import only public modules. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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


def _module_name(path: Path) -> str:
    parts = ["fastslow", *path.relative_to(REPO).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, source: str) -> Iterator[tuple[int, str]]:
    """Each fastslow name a module imports, absolute, with its line: ``from a import b`` gives ``a.b``."""
    # Relative imports are resolved against the module's package (bench scripts have none).
    in_repo = path.is_relative_to(REPO) and path.parts[len(REPO.parts)] in {*ALLOWED, "__init__.py"}
    package = _module_name(path).split(".") if in_repo else []
    if in_repo and path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [node.module])])
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*")


def _fastslow_imports(path: Path) -> set[str]:
    """The fastslow packages a module imports, by absolute name (relative ones stay in its package)."""
    return {name.split(".")[1] for _, name in _imports(path, path.read_text()) if name.startswith("fastslow.")}


def _private_reach(path: Path, source: str | None = None) -> list[str]:
    """``file:line import`` for each private module (or name) of another package that ``path`` imports."""
    parts = path.relative_to(REPO).parts
    own = parts[0] if parts[0] in ALLOWED else None
    wrong: dict[str, None] = {}  # ordered and once each: ``from a._b import c, d`` is one reach
    for line, name in _imports(path, path.read_text() if source is None else source):
        dotted = name.split(".")
        if dotted[0] != "fastslow" or len(dotted) < 3 or dotted[1] == own:
            continue
        private = [i for i, part in enumerate(dotted) if i > 1 and part.startswith("_") and not part.startswith("__")]
        if private:
            wrong[f"{path.relative_to(REPO)}:{line} {'.'.join(dotted[: private[0] + 1])}"] = None
    return list(wrong)


def _sources() -> list[Path]:
    return [REPO / "__init__.py", *(path for top in (*ALLOWED, "bench") for path in sorted((REPO / top).rglob("*.py")))]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    wrong = {
        str(path.relative_to(REPO)): sorted(_fastslow_imports(path) - ALLOWED[package] - {package})
        for path in (REPO / package).rglob("*.py")
    }
    assert not {where: what for where, what in wrong.items() if what}, "see docs/architecture.md"


def test_no_module_imports_another_packages_private_module() -> None:
    wrong = [reach for path in _sources() for reach in _private_reach(path)]
    assert not wrong, "private modules of another package (give it a public door):\n" + "\n".join(wrong)


def test_the_private_import_rule_sees_every_form() -> None:
    # The scan itself, on a module as if it sat in graphs/: by module, by name, lazily inside a
    # function; relative imports and the package's own private modules are its business.
    source = (
        "import fastslow.router._nodes\n"
        "from fastslow.engines.embedded import _batching\n"
        "from fastslow.router import Router\n"
        "from ._tools import x\n"
        "from fastslow.graphs._tools import y\n"
        "def lazy():\n"
        "    from fastslow.api._server import Server\n"
    )
    found = _private_reach(REPO / "graphs" / "middleware" / "probe.py", source)
    assert found == [
        "graphs/middleware/probe.py:1 fastslow.router._nodes",
        "graphs/middleware/probe.py:2 fastslow.engines.embedded._batching",
        "graphs/middleware/probe.py:7 fastslow.api._server",
    ]
    assert _private_reach(REPO / "bench" / "probe.py", "from fastslow.graphs._tools import y\n") == [
        "bench/probe.py:1 fastslow.graphs._tools",
    ]


def test_the_root_package_imports_its_subpackages_lazily_only() -> None:
    tree = ast.parse((REPO / "__init__.py").read_text())
    top_level = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    assert all(not (isinstance(node, ast.ImportFrom) and node.level) for node in top_level)
