"""The embedded engine, for real, with a throw-away embedding cache (for the conformance suite).

``first_build()`` guards the first engine build of each test process: under pytest-xdist the
workers share one embedding cache, and the first worker to build trains the heads while the others
wait on a file lock and then load them, instead of every worker training the same heads at once.
"""

from __future__ import annotations

import asyncio
import atexit
import fcntl
import os
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Literal

from fastslow.engines.embedded import EmbeddedEngine
from fastslow.router.settings import EmbeddedSettings

_CACHE_DIR: Path | None = None
_BUILT = threading.Event()
_FIRST = threading.Lock()


@contextmanager
def first_build(cache_dir: Path | None = None) -> Iterator[None]:
    """Hold the shared cache's build lock for this process's first engine build; later builds pass."""
    if _BUILT.is_set():
        yield
        return
    directory = cache_dir or _session_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with _FIRST, (directory / ".first-build.lock").open("a") as lock:
        if _BUILT.is_set():  # another thread of this process built meanwhile
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            _BUILT.set()
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def build_lock(cache_dir: Path) -> Iterator[None]:
    """The shared cache's build lock, held for the block (one engine build at a time, across workers)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / ".first-build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _session_cache_dir() -> Path:
    """The session's cache (tests/conftest.py sets it for every test), else one of this process's own.

    Shared, repeated engines reuse example embeddings and trained heads; a cache of our own is
    removed at exit.
    """
    global _CACHE_DIR
    shared = os.environ.get("FASTSLOW_EMBEDDED__CACHE_DIR")
    if shared:
        return Path(shared)
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
    directory = cache_dir or _session_cache_dir()
    # Every build, not only the first: each example set trains heads of its own, and a warm build
    # takes a fraction of a second, so the workers may as well take turns.
    with build_lock(directory):
        engine = await asyncio.to_thread(EmbeddedEngine.from_settings, settings, cache_dir=directory)
    try:
        yield engine
    finally:
        await engine.aclose()


def child_env(**settings: str) -> dict[str, str]:
    """The environment for a fastslow process a test starts: none of this process's ``FASTSLOW_``
    settings, ``settings`` instead, and the session's embedding cache, so that the child loads the
    heads another process of the run trained instead of embedding and training them again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTSLOW_")}
    cache = os.environ.get("FASTSLOW_EMBEDDED__CACHE_DIR")
    if cache:
        env["FASTSLOW_EMBEDDED__CACHE_DIR"] = cache
    return env | settings
