"""The background: ordinary, benign text every policy-check rule also learns as "not violated".

A rule trained on its own examples alone learns whatever separates them, often length or style:
the prompt-injection set's negatives are short questions, so a rule trained on it denied 81 % of
ordinary moderation texts. Against the background it has to learn what a violation is instead.

The texts were written for fastslow (``background/*.jsonl``: questions, commands and instructions,
chit-chat, tool calls, paragraphs and long documents, in 21 languages), and are disjoint from every
evaluation set (``tests/test_background.py`` checks). Long ones are learnt in overlapping pieces of
``UNIT_CHARS``, so a long document is several pieces of ordinary text. Their embeddings ship
beside them, one ``.npy`` per embedder, checked against the sha256 in ``background/manifest.json``
together with the texts they embed, so a cold start embeds nothing; for an embedder without
shipped vectors they are embedded once through the cache.
Rebuild after editing the texts: ``python bench/build_background.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fastslow.router import ConfigError

from ._cache import EmbeddingCache
from ._embedders import Embedder, verify_sha256
from ._reading import check_windows, squash
from ._shards import read_manifest, record

__all__ = ["BACKGROUND_DIR", "Background", "background_units", "build", "load_background"]

log = logging.getLogger("fastslow.embedded")

BACKGROUND_DIR = Path(__file__).resolve().parent / "background"
"""Resolved: an editable install links this module, and the texts and vectors live beside its source."""
UNIT_CHARS = 400
"""Long background texts are learnt in pieces of this size (overlapping by 100): ordinary text of
every length up to a few sentences; a check's own windows are shorter (``_reading``)."""
UNIT_STEP = 300

_loaded: dict[tuple[str, str], Background] = {}
_loaded_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Background:
    units: tuple[str, ...]
    """Check windows of the background texts, sorted and unique."""
    vectors: NDArray[np.float32]
    digest: str
    """sha256 of the units: part of the key of every head trained with them."""


def background_units(directory: Path = BACKGROUND_DIR) -> tuple[str, ...]:
    """Every background text cut into check windows, sorted and de-duplicated."""
    units: set[str] = set()
    for path in sorted(directory.glob("*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    text = squash(json.loads(line)["text"])
                    units.update(check_windows(text, size=UNIT_CHARS, step=UNIT_STEP, limit=len(text))[0])
    return tuple(sorted(units))


def _digest(units: tuple[str, ...]) -> str:
    return hashlib.sha256("\n".join(units).encode("utf-8")).hexdigest()


def load_background(
    embedder: Embedder, cache: EmbeddingCache | None = None, *, directory: Path = BACKGROUND_DIR
) -> Background:
    """The background units and their embeddings for ``embedder`` (blocking).

    Raises:
        ConfigError: the shipped vectors fail their hash check, or do not match the texts.
    """
    key = (str(directory), embedder.model_id)
    with _loaded_lock:
        if key in _loaded:
            return _loaded[key]
    units = background_units(directory)
    digest = _digest(units)
    entry = read_manifest(directory).get(embedder.model_id)
    if entry is not None:
        path = directory / entry["file"]
        if entry["units_sha256"] != digest:
            raise ConfigError(
                "the background texts changed since their embeddings were built; run python bench/build_background.py",
                path=str(path),
            )
        verify_sha256(path, entry["sha256"])
        vectors = np.load(path, allow_pickle=False).astype(np.float32)
        if vectors.shape != (len(units), embedder.dim):
            raise ConfigError(f"background embeddings have shape {vectors.shape}", path=str(path))
        background = Background(units=units, vectors=vectors, digest=digest)
        with _loaded_lock:
            _loaded[key] = background  # shipped and hash-checked: the same for every engine of the process
        return background
    log.warning("no shipped background embeddings for %s: embedding %d texts once", embedder.model_id, len(units))
    store = cache if cache is not None else EmbeddingCache()
    return Background(units=units, vectors=store.embed(embedder, list(units)), digest=digest)


def build(embedder: Embedder, directory: Path = BACKGROUND_DIR) -> Path:
    """Embed the background with ``embedder`` and record the vectors in the manifest."""
    units = background_units(directory)
    vectors = embedder.embed(list(units)).astype(np.float16)
    path = directory / f"{embedder.name}.npy"
    np.save(path, vectors, allow_pickle=False)
    record(directory, embedder.model_id, path, units_sha256=_digest(units), units=str(len(units)))
    return path
