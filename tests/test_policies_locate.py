"""Which policy file a process uses: FASTSLOW_POLICY_FILE, else ./fastslow-policy.yaml, else the built-in one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fastslow.policies import BUILTIN_POLICY, POLICY_FILE_NAME, load_policy, locate_policy
from fastslow.router import ConfigError, Settings

REPO = Path(__file__).resolve().parent.parent


def test_the_built_in_policy_is_the_example_and_has_what_the_graphs_need() -> None:
    assert BUILTIN_POLICY.read_bytes() == (REPO / "examples" / "policy.yaml").read_bytes()
    tasks = load_policy(BUILTIN_POLICY).tasks
    assert tasks["support"].kind == "route" and tasks["tool_safety"].kind == "check"


def test_with_nothing_configured_the_built_in_policy_is_used(tmp_path: Path) -> None:
    source = locate_policy(Settings(), cwd=tmp_path)
    assert source.origin == "built-in" and source.path == BUILTIN_POLICY
    assert "fastslow init" in source.describe() and "FASTSLOW_POLICY_FILE" in source.describe()


def test_a_policy_in_the_working_directory_wins_over_the_built_in_one(tmp_path: Path) -> None:
    shutil.copy(BUILTIN_POLICY, tmp_path / POLICY_FILE_NAME)
    source = locate_policy(Settings(), cwd=tmp_path)
    assert source.origin == "working directory" and source.path == tmp_path / POLICY_FILE_NAME
    assert str(source.path) in source.describe()


def test_the_setting_wins_over_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = tmp_path / "mine.yaml"
    shutil.copy(BUILTIN_POLICY, chosen)
    shutil.copy(BUILTIN_POLICY, tmp_path / POLICY_FILE_NAME)
    monkeypatch.setenv("FASTSLOW_POLICY_FILE", str(chosen))
    source = locate_policy(Settings(), cwd=tmp_path)
    assert source.origin == "settings" and source.path == chosen
    assert source.describe() == f"{chosen} (FASTSLOW_POLICY_FILE)"


def test_a_configured_file_that_is_missing_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such policy file") as raised:
        locate_policy(Settings(policy_file=tmp_path / "gone.yaml"), cwd=tmp_path)
    assert raised.value.key == "policy_file"
