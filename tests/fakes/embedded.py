"""The embedded engine, for real, with a throw-away embedding cache (for the conformance suite)."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from fastslow.engines.embedded import EmbeddedEngine
from fastslow.router.settings import EmbeddedSettings

_CACHE_DIR: Path | None = None


def _session_cache_dir() -> Path:
    """One cache per test process, so repeated engines reuse example embeddings; removed at exit."""
    global _CACHE_DIR
    if _CACHE_DIR is None:
        _CACHE_DIR = Path(tempfile.mkdtemp(prefix="fastslow-embeddings-"))
        atexit.register(shutil.rmtree, _CACHE_DIR, True)
    return _CACHE_DIR


@asynccontextmanager
async def running_embedded_engine(
    *,
    examples: Path | None = None,
    embedder: Literal["auto", "minilm", "e5"] = "auto",
    cache_dir: Path | None = None,
) -> AsyncIterator[EmbeddedEngine]:
    """An ``EmbeddedEngine`` built from settings (zero-shot, or with ``examples``), closed afterwards."""
    settings = EmbeddedSettings(examples=examples, embedder=embedder)
    engine = await asyncio.to_thread(
        EmbeddedEngine.from_settings, settings, cache_dir=cache_dir or _session_cache_dir()
    )
    try:
        yield engine
    finally:
        await engine.aclose()
