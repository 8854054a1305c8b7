"""An on-disk cache of example embeddings, keyed by (embedder model id, sha256 of the text).

Each embedder gets a folder; each batch of newly embedded texts is one ``.npz`` shard written
atomically (temporary file, then rename), so concurrent processes never see half a file and a
restart reads every shard back instead of running the model. Unreadable shards are skipped.

Before running the model on texts it has not seen, a cache whose folder changed since it last read
it (the folder's mtime: one ``stat``) reads the shards written since, so processes sharing one
(replicas, the processes of an evaluation) embed a text once. States join the cache only where a
caller asks (``embed_states``: offline evaluation, ``EmbeddedSettings.cache_states``); they are
written in shards of ``STATE_SHARD_ENTRIES`` and at exit, not a file a state.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypeAlias

import numpy as np
from numpy.typing import NDArray

from fastslow.router.engine_api import StopToken

from ._embedders import Embedder
from ._shards import read_shard, write_shard
from ._shipped import shipped_vectors

__all__ = ["MEMORY_ONLY_ENTRIES", "STATE_SHARD_ENTRIES", "EmbeddingCache", "default_cache_dir"]

log = logging.getLogger("fastslow.embedded")

_Keep: TypeAlias = Literal["memory", "disk", "states"]

MEMORY_ONLY_ENTRIES = 50_000
"""Embeddings kept in memory only (``persist=False``), most recent first: about 75 MB at 384 dimensions."""
STATE_SHARD_ENTRIES = 256
"""New state embeddings (``embed_states``) written together in one shard: an evaluation of thousands
of rows leaves a few dozen files, not thousands."""


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
    """Embeds through the cache: texts seen before (by any process) are read, not recomputed.

    Args:
        directory: the cache's folder (``default_cache_dir()`` when omitted).
        shipped: start from the embeddings fastslow ships (``_shipped``: the built-in policy's
            texts); off only to build them.
    """

    def __init__(self, directory: Path | None = None, *, shipped: bool = True) -> None:
        self.directory = directory if directory is not None else default_cache_dir()
        self._shipped = shipped
        self._memory: dict[str, dict[bytes, NDArray[np.float32]]] = {}
        self._shards: dict[str, set[str]] = {}
        """Per model, the shard files already read into ``_memory``."""
        self._seen_mtime: dict[str, int] = {}
        """Per model, the folder's mtime when its shards were last listed."""
        self._pending: dict[str, dict[bytes, NDArray[np.float32]]] = {}
        """Per model, state embeddings not written yet (``embed_states``)."""
        self._flush_at_exit = False
        self._recent: OrderedDict[tuple[str, bytes], NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    def _folder(self, model_id: str) -> Path:
        return self.directory / model_id

    def _load(self, model_id: str) -> dict[bytes, NDArray[np.float32]]:
        table = self._memory.get(model_id)
        if table is not None:
            return table
        self._memory[model_id] = dict(shipped_vectors(model_id)) if self._shipped else {}
        self._shards[model_id] = set()
        self._read_new_shards(model_id)
        return self._memory[model_id]

    def vectors(self, model_id: str) -> dict[bytes, NDArray[np.float32]]:
        """Every embedding of ``model_id`` the cache holds (its folder's and the shipped ones), by text sha256."""
        with self._lock:
            self._load(model_id)
            self._read_new_shards(model_id)
            return dict(self._memory[model_id])

    def _read_new_shards(self, model_id: str) -> None:
        """Read the shards of ``model_id``'s folder not read before, if the folder changed since it was listed."""
        folder = self._folder(model_id)
        try:
            mtime = folder.stat().st_mtime_ns
        except OSError:
            return
        if self._seen_mtime.get(model_id) == mtime:
            return
        self._seen_mtime[model_id] = mtime
        table, read = self._memory[model_id], self._shards[model_id]
        for shard in sorted(folder.glob("*.npz")):
            if shard.name in read:
                continue
            read.add(shard.name)
            try:
                table.update(read_shard(shard))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("skipping unreadable embedding cache shard %s: %s", shard, exc)

    def _write(self, model_id: str, keys: list[bytes], vectors: NDArray[np.float32]) -> None:
        folder = self._folder(model_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            name = hashlib.sha256(b"".join(sorted(keys))).hexdigest()[:32] + ".npz"
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                write_shard(fh, keys, vectors)
            os.replace(tmp, folder / name)
            self._shards.setdefault(model_id, set()).add(name)
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
        return self._embed(embedder, texts, keep="disk" if persist else "memory", stop=stop)

    def embed_states(
        self, embedder: Embedder, texts: Sequence[str], *, stop: StopToken | None = None
    ) -> NDArray[np.float32]:
        """``embed`` for what an engine reads of states, kept like examples' (for offline evaluation).

        An evaluation reads each row once; the next evaluation of the same rows (another threshold,
        another policy, the tuning loop) then runs no model. New embeddings are written in shards of
        ``STATE_SHARD_ENTRIES``, and the rest when ``flush`` is called or the process exits. The
        texts themselves are never written, only their sha256 and vectors.

        Raises:
            Abandoned: ``stop`` said to stop while the model ran.
        """
        return self._embed(embedder, texts, keep="states", stop=stop)

    def _embed(
        self, embedder: Embedder, texts: Sequence[str], *, keep: _Keep, stop: StopToken | None
    ) -> NDArray[np.float32]:
        """``keep``: where new embeddings go: ``memory`` (recent ones only), ``disk`` (a shard
        now), ``states`` (a shard of ``STATE_SHARD_ENTRIES``, the rest at ``flush``)."""
        model_id = embedder.model_id
        keys = [_digest(t) for t in texts]
        with self._lock:
            table = self._load(model_id)
            missing: dict[bytes, str] = {}
            found: dict[bytes, NDArray[np.float32]] = {}
            for key, text in zip(keys, texts, strict=True):
                vector = table.get(key)
                if vector is None:
                    vector = self._recent.get((model_id, key))
                if vector is None:
                    missing.setdefault(key, text)
                else:
                    found[key] = vector
            if missing and keep != "memory":
                # Another process sharing the folder may have embedded them since it was read.
                self._read_new_shards(model_id)
                for key in [k for k in missing if k in table]:
                    found[key] = table[key]
                    del missing[key]
        # The model runs outside the cache's lock: the embedder has its own, fair one, and a long
        # run must not hold up requests whose texts are all cached.
        if missing:
            fresh = embedder.embed(list(missing.values()), stop=stop)
            with self._lock:
                for key, vector in zip(missing, fresh, strict=True):
                    found[key] = vector
                    if keep == "memory":
                        self._remember(model_id, key, vector)
                    else:
                        table[key] = vector
                if keep == "disk":
                    self._write(model_id, list(missing), fresh)
                elif keep == "states":
                    self._hold(model_id, dict(zip(missing, fresh, strict=True)))
        out = np.empty((len(texts), embedder.dim), dtype=np.float32)
        for i, key in enumerate(keys):
            out[i] = found[key]
        return out

    def _hold(self, model_id: str, vectors: dict[bytes, NDArray[np.float32]]) -> None:
        """Keep new state embeddings for a later shard (under the lock); write one when there are enough."""
        pending = self._pending.setdefault(model_id, {})
        pending.update(vectors)
        if not self._flush_at_exit:
            self._flush_at_exit = True
            atexit.register(self.flush)
        if len(pending) >= STATE_SHARD_ENTRIES:
            self._flush_model(model_id)

    def flush(self) -> None:
        """Write the state embeddings not written yet (``embed_states``)."""
        with self._lock:
            for model_id in list(self._pending):
                self._flush_model(model_id)
            if self._flush_at_exit:
                # Nothing is left to write at exit: let a closed engine's cache (and every vector
                # it holds) go, instead of the exit hook keeping it alive for the process's life.
                self._flush_at_exit = False
                atexit.unregister(self.flush)

    def _flush_model(self, model_id: str) -> None:
        pending = self._pending.pop(model_id, {})
        if pending:
            self._write(model_id, list(pending), np.stack(list(pending.values())))

    def _remember(self, model_id: str, key: bytes, vector: NDArray[np.float32]) -> None:
        self._recent[(model_id, key)] = vector
        self._recent.move_to_end((model_id, key))
        while len(self._recent) > MEMORY_ONLY_ENTRIES:
            self._recent.popitem(last=False)
