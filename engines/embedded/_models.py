"""The embedded engines' models, loaded once and shared by every engine built from them."""

from __future__ import annotations

import threading
from pathlib import Path

from fastslow.router.settings import EmbeddedSettings

from ._batching import BatchingEmbedder
from ._cache import EmbeddingCache
from ._embedded_engine import EmbeddedEngine
from ._embedders import Embedder, load_embedder
from ._example_engine import ExampleEngine
from ._examples import ExampleSet, load_examples
from ._sparrow import SparrowEngine

__all__ = ["EmbeddedModels"]


class EmbeddedModels:
    """The embedder, the zero-shot model and the embedding cache, each loaded on first use.

    Loading and hash-checking the embedder is the slow part of building an embedded engine, so an
    engine pool that builds new engines on every policy reload keeps one of these; training a head
    on examples already embedded is quick. The embedder batches concurrent short reads into one
    model call (``BatchingEmbedder``).

    Args:
        settings: ``Settings.embedded``: which embedder, and the examples file.
        cache_dir: where example embeddings persist; the user's cache directory when omitted.
    """

    def __init__(self, settings: EmbeddedSettings | None = None, *, cache_dir: Path | None = None) -> None:
        self.settings = settings if settings is not None else EmbeddedSettings()
        self.cache = EmbeddingCache(cache_dir)
        self._lock = threading.Lock()
        self._embedder: Embedder | None = None
        self._sparrow: SparrowEngine | None = None

    @property
    def embedder(self) -> Embedder:
        with self._lock:
            if self._embedder is None:
                # Shared by every engine built from these models, so concurrent reads batch together.
                model = load_embedder(self.settings.embedder)
                self._embedder = BatchingEmbedder(model) if self.settings.batching else model
            return self._embedder

    @property
    def sparrow(self) -> SparrowEngine:
        with self._lock:
            if self._sparrow is None:
                self._sparrow = SparrowEngine()
            return self._sparrow

    def file_examples(self) -> ExampleSet | None:
        """The examples file the settings name, read and checked; ``None`` when none is set."""
        return load_examples(self.settings.examples) if self.settings.examples is not None else None

    def example_engine(self, examples: ExampleSet) -> ExampleEngine:
        """An example-trained engine on ``examples`` (blocking: embeds them and fits the heads)."""
        return ExampleEngine(
            examples,
            self.embedder,
            cache=self.cache,
            open_set_rate=self.settings.open_set_rate,
            use_background=self.settings.background,
            head=self.settings.head,
            cache_states=self.settings.cache_states,
            check_read_tokens=self.settings.check_read_tokens,
        )

    def embedded_engine(self, examples: ExampleSet | None) -> EmbeddedEngine:
        """The default engine: heads trained on ``examples`` where they exist, zero-shot elsewhere."""
        trained = self.example_engine(examples) if examples is not None and examples.questions else None
        return EmbeddedEngine(
            sparrow=self.sparrow,
            embedder=self.embedder,
            examples=trained,
            cache=self.cache,
            cache_states=self.settings.cache_states,
        )
