"""fastslow as a user installs it: one ``fastslow`` package in the wheel, working beside the user's own code.

The wheel is built from a copy of the working tree (tracked and untracked, as git would commit it)
with the setuptools this environment has, so no test reaches a package index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIRS = sorted({p.split(".")[1] for p in SETUPTOOLS["packages"] if p != "fastslow"})


def _source_files() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: the wheel is built from the files git would commit")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


@dataclass(frozen=True, slots=True)
class Build:
    wheel: Path
    output: str
    """What the build printed (stdout and stderr), under pip's ``-q`` as ``make install`` runs it."""


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    source = tmp_path_factory.mktemp("source")
    for name in _source_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."],
        cwd=source,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("fastslow-*.whl")
    return Build(wheel=built, output=done.stdout + done.stderr)


@pytest.fixture(scope="module")
def wheel(build: Build) -> Path:
    return build.wheel


def test_the_build_prints_no_setuptools_warnings(build: Build) -> None:
    # `make install` and `make run` build the same way (an editable install is a build too): a
    # warning here is a screenful on every install, such as a data folder setuptools takes for a
    # package missing from [tool.setuptools] packages.
    assert "warning" not in build.output.lower(), build.output


def test_the_wheel_holds_the_fastslow_package_and_its_metadata_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    (dist_info,) = tops - {"fastslow"}
    assert dist_info.startswith("fastslow-") and dist_info.endswith(".dist-info")
    # Nothing of the repository but the packages: no tests/, bench/, docs/ or stray root module.
    root_files = {name.split("/", 1)[1] for name in names if name.count("/") == 1 and name.startswith("fastslow/")}
    assert root_files == {"__init__.py", "py.typed"}
    subfolders = {name.split("/")[1] for name in names if name.startswith("fastslow/") and name.count("/") > 1}
    assert subfolders == {*PACKAGE_DIRS, "examples"}
    assert f"{dist_info}/licenses/LICENSE" in names


def test_the_wheel_has_every_module_and_data_file_of_the_packages(wheel: Path) -> None:
    in_wheel = {name.removeprefix("fastslow/") for name in zipfile.ZipFile(wheel).namelist()}
    wanted = {
        name
        for name in _source_files()
        if name.split("/")[0] in PACKAGE_DIRS and "__pycache__" not in name and not name.endswith(".pyc")
    }
    assert wanted - in_wheel == set(), "add these to [tool.setuptools] packages or package-data"
    assert "examples/policy.yaml" in in_wheel


def _fresh_venv(base: Path, wheel: Path) -> Path:
    """A new virtual environment with the wheel installed by pip, its dependencies borrowed from this one.

    Installing the dependencies from an index would make the test depend on the network; a path
    line pointing at this environment's site-packages gives them, and nothing else: the .pth files
    there (this checkout's editable install among them) are not read for a path added that way.
    """
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "zz_borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


USER_SCRIPT = """
import sys
from pathlib import Path
from typing import TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph

import fastslow
from fastslow import build_runtime, get_settings, router_node

import api  # the user's own package and router.py, next to this script
import router
assert api.MINE and router.MINE

class State(TypedDict, total=False):
    messages: list[AnyMessage]
    route: str | None
    decision: dict

def team(name):
    def node(state):
        return {"messages": state["messages"]}
    return node

runtime = build_runtime(get_settings())
graph = StateGraph(State)
teams = ("billing", "technical", "account", "frontier")
graph.add_node("route", router_node(runtime.router, "support"), destinations=teams)
for name in teams:
    graph.add_node(name, team(name))
    graph.add_edge(name, END)
graph.add_edge(START, "route")
final = graph.compile().invoke({"messages": [HumanMessage("I was charged twice for my subscription this month")]})
# Every module of fastslow's is known by its fastslow. name; the user's api and router stay theirs.
home = Path(fastslow.__file__).parent
modules = sorted(
    name
    for name, module in list(sys.modules.items())
    if getattr(module, "__file__", None) and Path(module.__file__).is_relative_to(home)
    and not name.startswith("fastslow")
)
assert api.MINE and router.MINE and not hasattr(api, "create_app")
print(fastslow.__file__)
print(runtime.policy_source.origin)
print(modules)
print(final["route"])
"""


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fresh_venv(tmp_path_factory.mktemp("installed"), wheel)


def _user_env(tmp_path: Path) -> dict[str, str]:
    """A user's environment: no FASTSLOW_ settings of the test run but the shared embedding cache
    (the same weights give the same vectors; only the run's time is saved)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTSLOW_", "PYTHON"))}
    env |= {"FASTSLOW_DATA_DIR": str(tmp_path / "data"), "FASTSLOW_SETTINGS_FILE": str(tmp_path / "none.toml")}
    if "FASTSLOW_EMBEDDED__CACHE_DIR" in os.environ:
        env["FASTSLOW_EMBEDDED__CACHE_DIR"] = os.environ["FASTSLOW_EMBEDDED__CACHE_DIR"]
    return env


@pytest.mark.slow
def test_an_installed_wheel_works_beside_the_users_own_api_and_router(venv: Path, tmp_path: Path) -> None:
    app = tmp_path / "userapp"
    (app / "api").mkdir(parents=True)
    (app / "api" / "__init__.py").write_text(
        'MINE = True\n\ndef build_runtime():\n    raise RuntimeError("the user s own api package")\n'
    )
    (app / "router.py").write_text("MINE = True\nrouter_node = 'not fastslow'\n")
    (app / "main.py").write_text(USER_SCRIPT)
    env = _user_env(tmp_path)

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=app, env=env, capture_output=True, text=True, timeout=600, check=False)

    done = run(venv / "bin" / "python", "main.py")
    assert done.returncode == 0, done.stderr
    where, origin, bare, route = done.stdout.strip().splitlines()[-4:]
    assert Path(where).is_relative_to(venv), "fastslow came from the fresh environment"
    assert origin == "built-in"
    assert bare == "[]"
    assert route == "billing"

    ran = run(venv / "bin" / "fastslow", "graph", "run", "support-triage", "--input", "My card keeps getting declined")
    assert ran.returncode == 0, ran.stderr
    assert "the built-in example policy" in ran.stderr
    state = json.loads(ran.stdout)
    assert state["route"] == "billing" and state["decision"]["system"] == 1


def _readme_python(heading: str) -> str:
    """The first Python block of the README after ``heading``, exactly as printed there."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index(heading) :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```\n", start)]


BROKEN_POLICY = "version: 1\ntasks:\n  support:\n    kind: route\n     instructions: Which team?\n"


@pytest.mark.slow
def test_a_newcomers_first_hour_with_the_wheel_outside_the_checkout(venv: Path, tmp_path: Path) -> None:
    # In a folder of their own, far from the checkout: the README's graph, then the commands they
    # meet next, as the README and the docs say they behave.
    home = tmp_path / "newcomer"
    home.mkdir()
    env = _user_env(tmp_path)

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=home, env=env, capture_output=True, text=True, timeout=600, check=False)

    (home / "graph.py").write_text(_readme_python("## Using the router in a graph"))
    ran = run(venv / "bin" / "python", "graph.py")
    assert ran.returncode == 0, ran.stderr
    first, again = ran.stdout.strip().splitlines()[-2:]
    assert first.split()[:2] == ["billing", "confident"], ran.stdout
    assert again == "billing sticky", ran.stdout  # the README says what it prints

    fastslow = venv / "bin" / "fastslow"
    good = run(fastslow, "policy", "check", "--json")
    assert good.returncode == 0, good.stderr
    checked = json.loads(good.stdout)
    assert checked["ok"] is True and checked["origin"] == "built-in"
    assert set(checked["tasks"]) == {"support", "triage", "tool_safety"}

    (home / "fastslow-policy.yaml").write_text(BROKEN_POLICY)  # what `fastslow init` writes, then a slip
    bad = run(fastslow, "policy", "check")
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: ") and "fastslow-policy.yaml:5: invalid YAML" in bad.stderr
    assert "indentation" in bad.stderr
    assert json.loads(run(fastslow, "policy", "check", "--json").stdout)["error"]["line"] == 5
    (home / "fastslow-policy.yaml").unlink()

    rows = home / "rows.jsonl"
    rows.write_text('{"task": "suport", "state": "I was charged twice", "label": "billing"}\n')
    nothing = run(fastslow, "eval", "--data", rows, "--out", home / "report", "--no-progress")
    assert nothing.returncode == 3, nothing.stderr
    assert "did you mean 'support'" in nothing.stderr and "no row was answered" in nothing.stderr
