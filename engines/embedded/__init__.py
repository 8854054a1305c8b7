"""fastslow's in-process CPU engines: zero-shot (sparrow-decider) and example-trained heads on embeddings.

``EmbeddedEngine`` is the default System-1 engine: built with ``EmbeddedEngine.from_settings``, it
answers questions its examples file covers with trained, calibrated heads (adapted to the examples
by a contrastive map and a nearest-example vote, ``AdaptedHead``) and every other question
zero-shot. ``SparrowEngine`` and ``ExampleEngine`` are its two halves, usable on their own.
"""

from ._adapted import AdaptedHead, fit_adapted_head
from ._background import Background, load_background
from ._batching import BatchingEmbedder
from ._cache import EmbeddingCache, default_cache_dir
from ._embedded_engine import SIMILARITY_TEMPERATURE, EmbeddedEngine
from ._embedders import (
    E5Embedder,
    Embedder,
    EmbedderName,
    MiniLMEmbedder,
    load_embedder,
    minilm_available,
    verify_sha256,
)
from ._ensemble import ExampleEnsemble, Pool, fit_pool
from ._example_engine import ExampleEngine, Reading
from ._examples import ExampleSet, QuestionExamples, examples_from_mapping, load_examples
from ._head import SoftmaxHead, fit_head
from ._models import EmbeddedModels
from ._sparrow import SPARROW_MODELS, SparrowEngine

__all__ = [
    "SIMILARITY_TEMPERATURE",
    "SPARROW_MODELS",
    "AdaptedHead",
    "Background",
    "BatchingEmbedder",
    "E5Embedder",
    "EmbeddedEngine",
    "EmbeddedModels",
    "Embedder",
    "EmbedderName",
    "EmbeddingCache",
    "ExampleEngine",
    "ExampleEnsemble",
    "ExampleSet",
    "MiniLMEmbedder",
    "Pool",
    "QuestionExamples",
    "Reading",
    "SoftmaxHead",
    "SparrowEngine",
    "default_cache_dir",
    "examples_from_mapping",
    "fit_adapted_head",
    "fit_head",
    "fit_pool",
    "load_background",
    "load_embedder",
    "load_examples",
    "minilm_available",
    "verify_sha256",
]
