"""Decisions learned from labelled examples: embeddings plus a calibrated softmax head per question."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fastslow.router import Answer, ConfigError, EmbeddedSettings, Image, NoAnswer, Question, ReadOptions, State
from fastslow.router.engine_api import EngineLimits, EngineReply, StopToken, run_blocking

from ._cache import EmbeddingCache
from ._common import as_text, check_call, make_answer, with_budget
from ._embedders import Embedder
from ._examples import ExampleSet, load_examples
from ._head import SoftmaxHead, fit_head

__all__ = ["ExampleEngine"]

log = logging.getLogger("fastslow.embedded")


class ExampleEngine:
    """Answers the questions its examples file covers; every other question gets a ``NoAnswer``.

    At construction every example is embedded (through the on-disk cache, so a restart runs no
    model) and one head is trained per question; questions with identical examples share a head.
    Construction blocks: call it from a worker thread in async code. ``EmbeddedEngine`` sends the
    questions this engine does not cover to the zero-shot engine.

    Args:
        examples: the labelled examples, from ``load_examples`` or ``examples_from_mapping``.
        embedder: the sentence embedder (``load_embedder``).
        cache: where example embeddings are kept; a cache in the user cache directory when omitted.
    """

    name = "examples"
    limits = EngineLimits(accepts_images=False)

    def __init__(self, examples: ExampleSet, embedder: Embedder, *, cache: EmbeddingCache | None = None) -> None:
        self.examples = examples
        self.embedder = embedder
        self.model = f"{embedder.name}+head"
        self._cache = cache if cache is not None else EmbeddingCache()
        self._closed = False
        started = time.perf_counter()
        texts = sorted({t for q in examples.questions.values() for ts in q.examples.values() for t in ts})
        vectors = self._cache.embed(embedder, texts) if texts else np.zeros((0, embedder.dim), np.float32)
        row = {t: i for i, t in enumerate(texts)}
        by_fingerprint: dict[str, SoftmaxHead] = {}
        self.heads: dict[str, SoftmaxHead] = {}
        for name, q in examples.questions.items():
            head = by_fingerprint.get(q.fingerprint)
            if head is None:
                labels = list(q.options)
                rows = [row[t] for ts in q.examples.values() for t in ts]
                targets = [i for i, ts in enumerate(q.examples.values()) for _ in ts]
                head = fit_head(vectors[rows], labels, targets)
                by_fingerprint[q.fingerprint] = head
            self.heads[name] = head
        log.info(
            "trained %d example heads with %s in %.2f s (%d example texts)",
            len(by_fingerprint),
            embedder.name,
            time.perf_counter() - started,
            len(texts),
        )

    @classmethod
    def from_file(cls, path: str | Path, embedder: Embedder, *, cache: EmbeddingCache | None = None) -> ExampleEngine:
        """Load an examples file (JSON or YAML) and train on it."""
        return cls(load_examples(path), embedder, cache=cache)

    @classmethod
    def from_settings(cls, settings: EmbeddedSettings, *, cache_dir: Path | None = None) -> ExampleEngine:
        """Build from ``Settings.embedded``, whose ``examples`` must be set (blocking).

        Raises:
            ConfigError: no examples file, a bad one, or a model file that fails its hash check.
        """
        from ._models import EmbeddedModels  # it builds engines of this module

        models = EmbeddedModels(settings, cache_dir=cache_dir)
        examples = models.file_examples()
        if examples is None:
            raise ConfigError("the examples engine needs an examples file", key="embedded.examples")
        return models.example_engine(examples)

    def uncovered(self, name: str, question: Question) -> str | None:
        """Why this engine cannot answer ``question`` under ``name``, or ``None`` when it can."""
        head = self.heads.get(name)
        if head is None:
            return f"no examples for question {name!r}"
        # A head answers a question whose options include all it was trained on; options without
        # examples (a route task's "none of these") get no probability from it, so they never win
        # here and low confidence escalates instead.
        if not set(head.labels) <= set(question.options):
            return (
                f"the examples for {name!r} have options {sorted(head.labels)}, "
                f"the question has {sorted(question.options)}"
            )
        return None

    def embed_state(self, state: State, stop: StopToken | None = None) -> NDArray[np.float32]:
        """The state's embedding (blocking; stops when ``stop`` says). States never reach the disk cache."""
        vector: NDArray[np.float32] = self.embedder.embed([as_text(state)], stop=stop)[0]
        return vector

    def probabilities(self, vector: NDArray[np.float32], name: str) -> dict[str, float]:
        """The head's distribution for question ``name`` given the state's embedding."""
        head = self.heads[name]
        p = head.probabilities(vector[None, :])[0]
        return {label: float(x) for label, x in zip(head.labels, p, strict=True)}

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """Answer the covered questions about ``state``; see ``fastslow.router.engine_api.DecisionEngine``."""
        clean = check_call(self.name, self._closed, state, questions, images)
        return await with_budget(self._decide(clean, questions), options, engine=self.name)

    async def _decide(self, state: State, questions: Mapping[str, Question]) -> EngineReply:
        started = time.perf_counter()
        reasons = {name: self.uncovered(name, q) for name, q in questions.items()}
        vector = None
        if any(r is None for r in reasons.values()):
            vector = await run_blocking(lambda stop: self.embed_state(state, stop))
        elapsed = (time.perf_counter() - started) * 1000.0
        answers: dict[str, Answer | NoAnswer] = {}
        for name, q in questions.items():
            reason = reasons[name]
            if reason is None and vector is not None:
                answers[name] = make_answer(
                    name, q, self.probabilities(vector, name), engine=self.name, model=self.model, latency_ms=elapsed
                )
            else:
                answers[name] = NoAnswer(
                    question=name,
                    kind=q.kind,
                    reason=reason or "no answer",
                    engine=self.name,
                    model=self.model,
                    latency_ms=elapsed,
                )
        return EngineReply(answers=answers, engine=self.name, model=self.model, latency_ms=elapsed)

    async def aclose(self) -> None:
        self._closed = True
