"""An on-disk cache of example embeddings, keyed by (embedder model id, sha256 of the text).

Each embedder gets a folder; each batch of newly embedded texts is one ``.npz`` shard written
atomically (temporary file, then rename), so concurrent processes never see half a file and a
restart reads every shard back instead of running the model. Unreadable shards are skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fastslow.router.engine_api import StopToken

from ._embedders import Embedder

__all__ = ["MEMORY_ONLY_ENTRIES", "EmbeddingCache", "default_cache_dir"]

log = logging.getLogger("fastslow.embedded")

MEMORY_ONLY_ENTRIES = 50_000
"""Embeddings kept in memory only (``persist=False``), most recent first: about 75 MB at 384 dimensions."""


def default_cache_dir(data_dir: Path | None = None) -> Path:
    """``DATA_DIR/cache/embeddings`` under fastslow's data directory (``Settings.resolved_data_dir()``).

    Without one (a cache made outside any settings), ``<user cache dir>/fastslow/embeddings`` (platformdirs).
    """
    if data_dir is not None:
        return data_dir / "cache" / "embeddings"
    import platformdirs

    return Path(platformdirs.user_cache_dir("fastslow")) / "embeddings"


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class EmbeddingCache:
    """Embeds through the cache: texts seen before (by any process) are read, not recomputed."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory if directory is not None else default_cache_dir()
        self._memory: dict[str, dict[bytes, NDArray[np.float32]]] = {}
        self._recent: OrderedDict[tuple[str, bytes], NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    def _folder(self, model_id: str) -> Path:
        return self.directory / model_id

    def _load(self, model_id: str) -> dict[bytes, NDArray[np.float32]]:
        table = self._memory.get(model_id)
        if table is not None:
            return table
        table = {}
        folder = self._folder(model_id)
        if folder.is_dir():
            for shard in sorted(folder.glob("*.npz")):
                try:
                    with np.load(shard, allow_pickle=False) as z:
                        keys, vectors = z["keys"], z["vectors"].astype(np.float32)
                except (OSError, ValueError, KeyError) as exc:
                    log.warning("skipping unreadable embedding cache shard %s: %s", shard, exc)
                    continue
                for key, vector in zip(keys, vectors, strict=True):
                    table[bytes(key)] = vector
        self._memory[model_id] = table
        return table

    def _write(self, model_id: str, keys: list[bytes], vectors: NDArray[np.float32]) -> None:
        folder = self._folder(model_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            name = hashlib.sha256(b"".join(sorted(keys))).hexdigest()[:32] + ".npz"
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, keys=np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 32), vectors=vectors)
            os.replace(tmp, folder / name)
        except OSError as exc:  # a read-only or full disk costs speed, not correctness
            log.warning("could not write the embedding cache under %s: %s", folder, exc)

    def embed(
        self,
        embedder: Embedder,
        texts: Sequence[str],
        *,
        persist: bool = True,
        stop: StopToken | None = None,
    ) -> NDArray[np.float32]:
        """Embeddings of ``texts`` by ``embedder``, running the model only on texts not cached.

        With ``persist=False`` new embeddings are kept in this process's memory only, and only the
        most recent ``MEMORY_ONLY_ENTRIES`` of them (they come from requests: option texts of
        arbitrary questions must not grow the process without bound).

        Raises:
            Abandoned: ``stop`` said to stop while the model ran.
        """
        keys = [_digest(t) for t in texts]
        with self._lock:
            table = self._load(embedder.model_id)
            missing: dict[bytes, str] = {}
            found: dict[bytes, NDArray[np.float32]] = {}
            for key, text in zip(keys, texts, strict=True):
                vector = table.get(key)
                if vector is None:
                    vector = self._recent.get((embedder.model_id, key))
                if vector is None:
                    missing.setdefault(key, text)
                else:
                    found[key] = vector
        # The model runs outside the cache's lock: the embedder has its own, fair one, and a long
        # run must not hold up requests whose texts are all cached.
        if missing:
            fresh = embedder.embed(list(missing.values()), stop=stop)
            with self._lock:
                for key, vector in zip(missing, fresh, strict=True):
                    found[key] = vector
                    if persist:
                        table[key] = vector
                    else:
                        self._remember(embedder.model_id, key, vector)
                if persist:
                    self._write(embedder.model_id, list(missing), fresh)
        out = np.empty((len(texts), embedder.dim), dtype=np.float32)
        for i, key in enumerate(keys):
            out[i] = found[key]
        return out

    def _remember(self, model_id: str, key: bytes, vector: NDArray[np.float32]) -> None:
        self._recent[(model_id, key)] = vector
        self._recent.move_to_end((model_id, key))
        while len(self._recent) > MEMORY_ONLY_ENTRIES:
            self._recent.popitem(last=False)
