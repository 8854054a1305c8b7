"""Trained heads on disk, keyed by everything that went into training them.

A key is the sha256 of the training recipe's version, the embedder's model id, the question's
examples and its role (none option, violation option, background); so a restart, or a reload whose
examples did not change, loads heads instead of training them, and any change trains afresh.
Each entry is one ``.npz`` (no pickles) written atomically; an unreadable one is retrained.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["HeadStore"]

log = logging.getLogger("fastslow.embedded")


class HeadStore:
    """A folder of trained heads (``<embedding cache>/_heads``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def key(recipe: Mapping[str, Any]) -> str:
        """The entry name for a training recipe (any JSON-able mapping)."""
        return hashlib.sha256(json.dumps(recipe, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def load(self, key: str) -> dict[str, NDArray[Any]] | None:
        path = self.directory / f"{key}.npz"
        try:
            with np.load(path, allow_pickle=False) as data:
                return {name: data[name] for name in data.files}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            log.warning("ignoring unreadable trained head %s: %s", path, exc)
            return None

    def save(self, key: str, arrays: Mapping[str, NDArray[Any]]) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    np.savez(fh, allow_pickle=False, **arrays)
                os.replace(tmp, self.directory / f"{key}.npz")
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:  # a read-only cache costs a retrain at the next start, nothing more
            log.warning("cannot keep trained head in %s: %s", self.directory, exc)
