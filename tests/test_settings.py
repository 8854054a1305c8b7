"""Settings come from FASTSLOW_* variables and a settings file; the environment wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from fastslow.router import Settings, get_settings


def test_defaults_use_the_embedded_engine() -> None:
    settings = get_settings()
    assert settings.engine == "embedded"
    assert settings.jev.profile == "structured"
    assert settings.jev.api_key is None


def test_environment_sets_nested_keys_and_keeps_secrets_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_ENGINE", "jev")
    monkeypatch.setenv("FASTSLOW_JEV__BASE_URL", "http://gpu-box:8011")
    monkeypatch.setenv("FASTSLOW_JEV__API_KEY", "sk-123")
    settings = Settings()
    assert settings.engine == "jev"
    assert settings.jev.base_url == "http://gpu-box:8011"
    assert settings.jev.api_key is not None and settings.jev.api_key.get_secret_value() == "sk-123"
    assert "sk-123" not in repr(settings)


def test_settings_file_is_read_and_environment_overrides_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "fastslow.toml"
    path.write_text('engine = "jev"\n[jev]\nprofile = "jev"\nbase_url = "https://api.typesafe.ai"\n')
    monkeypatch.setenv("FASTSLOW_SETTINGS_FILE", str(path))
    monkeypatch.setenv("FASTSLOW_ENGINE", "sparrow")
    settings = Settings()
    assert settings.engine == "sparrow"
    assert settings.jev.profile == "jev"
    assert settings.jev.base_url == "https://api.typesafe.ai"


def test_yaml_settings_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "fastslow.yaml"
    path.write_text("engine: logprob\nlogprob:\n  model: qwen\n")
    monkeypatch.setenv("FASTSLOW_SETTINGS_FILE", str(path))
    settings = Settings()
    assert settings.engine == "logprob"
    assert settings.logprob.model == "qwen"


def test_unknown_engine_and_keys_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_ENGINE", "gpt-router")
    with pytest.raises(ValidationError, match="engine"):
        Settings()


def test_data_dir_defaults_outside_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTSLOW_DATA_DIR")
    path = Settings().resolved_data_dir()
    assert "fastslow" in str(path)
    assert "site-packages" not in str(path)
