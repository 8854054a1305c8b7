"""The built-in policy's embeddings ship with fastslow, so a first start embeds none of its examples.

``engines/embedded/shipped/``: one ``.npz`` per bundled embedder, rebuilt by
``python bench/build_background.py --part builtin`` after the built-in policy's examples change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from fastslow.engines import examples_for
from fastslow.engines.embedded import EmbeddingCache, load_embedder
from fastslow.engines.embedded._shipped import SHIPPED_DIR, shipped_vectors
from fastslow.engines.embedded.tools import squash
from fastslow.policies import BUILTIN_POLICY, load_policy
from fastslow.router import ConfigError, Settings
from fastslow.router.engine_api import StopToken

E5 = "e5-small-q4-1571fc982750"
MINILM = "minilm-l6-v2-53aa51172d14"


def _builtin_texts() -> list[str]:
    """What a cold start of the built-in policy embeds: every example, squashed (``ExampleEngine``)."""
    examples = examples_for(Settings(), load_policy(BUILTIN_POLICY))
    assert examples is not None
    return sorted({squash(t) for q in examples.questions.values() for ts in q.examples.values() for t in ts})


def _key(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class _NoModel:
    """An embedder that must not run: the cache has to answer everything itself."""

    name = "e5-small-q4"
    model_id = E5
    dim = 384

    def __init__(self) -> None:
        self.asked: list[str] = []

    def count_tokens(self, text: str) -> int:
        return len(text)

    def embed(self, texts: Sequence[str], *, stop: StopToken | None = None) -> NDArray[np.float32]:
        self.asked += texts
        return np.zeros((len(texts), self.dim), dtype=np.float32)


@pytest.mark.parametrize("model_id", [E5, MINILM])
def test_every_builtin_example_ships_for_every_bundled_embedder(model_id: str) -> None:
    shipped = shipped_vectors(model_id)
    missing = [t for t in _builtin_texts() if _key(t) not in shipped]
    assert not missing, f"{len(missing)} texts without shipped vectors: run python bench/build_background.py"
    assert all(v.shape == (384,) and v.dtype == np.float32 for v in shipped.values())


def test_a_cold_cache_answers_the_builtin_examples_without_the_model(tmp_path: Path) -> None:
    texts = _builtin_texts()
    model = _NoModel()
    vectors = EmbeddingCache(tmp_path).embed(model, texts)  # type: ignore[arg-type]
    assert model.asked == [] and not list(tmp_path.rglob("*.npz"))  # nothing embedded, nothing written
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    # A text the policy does not hold is embedded as before; off, the shipped vectors are not read.
    EmbeddingCache(tmp_path).embed(model, ["not an example of the built-in policy"])  # type: ignore[arg-type]
    EmbeddingCache(tmp_path / "bare", shipped=False).embed(model, texts[:2])  # type: ignore[arg-type]
    assert model.asked == ["not an example of the built-in policy", *texts[:2]]


@pytest.mark.slow  # loads e5
def test_the_shipped_vectors_are_the_ones_the_model_computes() -> None:
    embedder = load_embedder("e5")
    texts = _builtin_texts()[::150]  # a few, long and short
    shipped = shipped_vectors(embedder.model_id)
    fresh = embedder.embed(texts)
    for text, vector in zip(texts, fresh, strict=True):
        assert np.allclose(shipped[_key(text)], vector, atol=1e-5), text


def test_a_shipped_file_that_fails_its_hash_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "e5-small-q4.npz").write_bytes((SHIPPED_DIR / "e5-small-q4.npz").read_bytes()[:-1])
    manifest = json.loads((SHIPPED_DIR / "manifest.json").read_text(encoding="utf-8"))
    (tmp_path / "manifest.json").write_text(json.dumps({E5: manifest[E5]}), encoding="utf-8")
    with pytest.raises(ConfigError):
        shipped_vectors(E5, tmp_path)
