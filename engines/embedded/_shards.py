"""The files the embedded engine keeps vectors in: the cache's shards, and the manifests of shipped vectors.

A shard is an ``.npz`` of ``keys`` (the sha256 of each text, 32 bytes a row) and ``vectors``: the
embedding cache writes one per batch it embeds, and the shipped vectors of the built-in policy use
the same format (``_shipped``). A manifest (``manifest.json`` beside shipped vectors) records, per
embedder model id, the file and its sha256, which loading checks (``_background``, ``_shipped``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["MANIFEST", "read_manifest", "read_shard", "record", "write_shard"]

MANIFEST = "manifest.json"


def read_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """``directory``'s manifest, by embedder model id; empty where there is none."""
    try:
        data: dict[str, dict[str, Any]] = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        return data
    except FileNotFoundError:
        return {}


def record(directory: Path, model_id: str, path: Path, **facts: object) -> None:
    """Enter ``path`` (beside the manifest), its sha256 and ``facts`` as ``model_id``'s vectors."""
    manifest = read_manifest(directory)
    manifest[model_id] = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), **facts}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_shard(
    fh: IO[bytes], keys: Sequence[bytes], vectors: NDArray[np.float32], *, compressed: bool = False
) -> None:
    """One shard of ``keys`` (text sha256s) and their ``vectors`` into ``fh``."""
    save = np.savez_compressed if compressed else np.savez
    save(fh, keys=np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 32), vectors=vectors)


def read_shard(path: Path) -> dict[bytes, NDArray[np.float32]]:
    """A shard's vectors by text sha256.

    Raises:
        OSError, ValueError, KeyError: the file is missing, not an ``.npz``, or not a shard.
    """
    with np.load(path, allow_pickle=False) as z:
        keys, vectors = z["keys"], z["vectors"].astype(np.float32)
    return {bytes(key): vector for key, vector in zip(keys, vectors, strict=True)}
