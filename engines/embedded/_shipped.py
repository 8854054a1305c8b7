"""Embeddings that ship with fastslow: the built-in policy's texts, so that a first start embeds none.

On a new machine the first ``fastslow decide``, ``fastslow serve`` or ``make run`` embedded the
built-in policy's 600-odd examples before it answered anything (about 18 s of e5 on one core, most
of a cold start). Their vectors ship beside this module instead, one ``.npz`` per embedder in the
cache's own shard format (sha256 of the text, vector), checked against the sha256 recorded in
``shipped/manifest.json``; ``EmbeddingCache`` starts from them as if it had written them itself.
They are the vectors the embedder computes, float32, so nothing trained on them differs from a
cold start's. A text edited since they were built is simply not among them and is embedded on
first use, as any new text is. Rebuild after editing the built-in policy's examples:
``python bench/build_background.py`` (``tests/test_shipped_embeddings.py`` fails until then).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ._embedders import Embedder, verify_sha256
from ._shards import read_manifest, read_shard, record, write_shard

if TYPE_CHECKING:
    from ._cache import EmbeddingCache

__all__ = ["SHIPPED_DIR", "build_shipped", "shipped_vectors"]

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
"""Resolved: an editable install links this module, and the vectors live beside its source."""


@functools.cache
def shipped_vectors(model_id: str, directory: Path = SHIPPED_DIR) -> Mapping[bytes, NDArray[np.float32]]:
    """The shipped embeddings of ``model_id``'s embedder, by the sha256 of their text; empty where none ship.

    Read once a process, read-only: every cache of the process starts from the same vectors.

    Raises:
        ConfigError: the file fails its hash check.
    """
    entry = read_manifest(directory).get(model_id)
    if entry is None:
        return MappingProxyType({})
    path = directory / entry["file"]
    verify_sha256(path, entry["sha256"])
    vectors = read_shard(path)
    for vector in vectors.values():
        vector.flags.writeable = False
    return MappingProxyType(vectors)


def build_shipped(
    embedder: Embedder, cold_start: Callable[[EmbeddingCache], object], directory: Path = SHIPPED_DIR
) -> Path:
    """Ship what ``cold_start(cache)`` embeds into an empty cache as ``embedder``'s vectors.

    ``cold_start`` does what a first start does (builds the built-in policy's engine on ``cache``):
    every vector it leaves in the cache ships, whatever the engine chose to read.
    """
    from ._cache import EmbeddingCache  # the cache reads this module: imported here, not at the top

    with tempfile.TemporaryDirectory() as scratch:
        cache = EmbeddingCache(Path(scratch), shipped=False)
        cold_start(cache)
        table = cache.vectors(embedder.model_id)
    keys = sorted(table)
    path = directory / f"{embedder.name}.npz"
    directory.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        write_shard(fh, keys, np.stack([table[k] for k in keys]).astype(np.float32), compressed=True)
    record(directory, embedder.model_id, path, texts=len(keys))
    shipped_vectors.cache_clear()
    return path
