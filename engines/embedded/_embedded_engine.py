"""The default System-1 engine: example-trained where examples exist, zero-shot otherwise.

Routing of one call, question by question:

* the examples file has this question with the same options -> its trained head;
* a choice without examples -> sparrow's zero-shot distribution blended with embedding
  similarity between the state and each option's text (a product of experts,
  ``p ∝ sqrt(p_sparrow * p_similarity)``);
* any other noul or score -> sparrow alone.

The blend was chosen by measurement over sparrow alone and similarity alone. On CLINC150 domains,
SNIPS intents and HWU64 scenarios it lifted zero-shot accuracy over sparrow alone by 13, 28 and 8
points with MiniLM (11, 28 and 6 with e5), while staying at sparrow's level on XSTest's safe/unsafe
choice, where similarity alone falls below the majority class; similarity alone needs no
instructions and so cannot tell a topic question from any other. See ``bench/engines.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fastslow.router import Answer, Choice, Image, NoAnswer, Question, ReadOptions, State
from fastslow.router.engine_api import EngineLimits, EngineReply, StopToken, run_blocking, split_and_ask
from fastslow.router.settings import EmbeddedSettings

from ._cache import EmbeddingCache
from ._common import as_text, check_call, make_answer, option_text, with_budget
from ._embedders import Embedder
from ._ensemble import ExampleEnsemble
from ._example_engine import ExampleEngine
from ._reading import CHECK_READ_CHARS, ends, squash
from ._sparrow import SparrowEngine
from ._zero_shot import calibrate_zero_shot

__all__ = ["SIMILARITY_TEMPERATURE", "EmbeddedEngine"]

log = logging.getLogger("fastslow.embedded")

SIMILARITY_TEMPERATURE: dict[str, float] = {
    # Softmax temperature over cosine similarities, per embedder, fitted by log-loss on CLINC150's
    # validation split (MiniLM 0.040 with option descriptions, 0.085 with bare names; e5 0.008 / 0.017).
    "minilm-l6-v2": 0.05,
    "e5-small-q4": 0.012,
}


class EmbeddedEngine:
    """In-process CPU engine, the one fastslow uses when nothing else is configured.

    Args:
        sparrow: the zero-shot engine.
        embedder: used for the choice blend and by ``examples``; without one, choices are sparrow's alone.
        examples: the example-trained engine, if an examples file is configured.
        cache: holds option-text embeddings (in memory only: they change with every new question);
            may be shared with ``examples``.
        cache_states: keep the embeddings of the states it reads in ``cache`` (offline evaluation;
            ``EmbeddedSettings.cache_states``); ``examples`` has its own switch.
    """

    name = "embedded"
    gen_ai_operation = "embeddings"
    """Its spans' ``gen_ai.operation.name``: it embeds the state and reads trained heads over the vectors."""
    limits = EngineLimits(
        max_score_levels=SparrowEngine.limits.max_score_levels,
        accepts_images=False,
        max_read_chars=CHECK_READ_CHARS,
        max_read_tokens=ExampleEngine.limits.max_read_tokens,
    )

    def __init__(
        self,
        *,
        sparrow: SparrowEngine,
        embedder: Embedder | None = None,
        examples: ExampleEngine | ExampleEnsemble | None = None,
        cache: EmbeddingCache | None = None,
        cache_states: bool = False,
    ) -> None:
        self.sparrow = sparrow
        self.cache_states = cache_states
        self.examples = examples
        if examples is not None:
            self.limits = replace(EmbeddedEngine.limits, max_read_tokens=examples.limits.max_read_tokens)
        self.examples_versions: Mapping[str, str] = examples.examples_versions if examples is not None else {}
        self.embedder = embedder if embedder is not None else (examples.embedder if examples else None)
        self._cache = cache if cache is not None else EmbeddingCache()
        self._temperature = SIMILARITY_TEMPERATURE.get(self.embedder.name) if self.embedder else None
        if self.embedder is not None and self._temperature is None:
            log.warning("no similarity temperature for embedder %r: choices use sparrow alone", self.embedder.name)
        self._closed = False

    @classmethod
    def from_settings(
        cls, settings: EmbeddedSettings | None = None, *, cache_dir: Path | None = None
    ) -> EmbeddedEngine:
        """Build from ``Settings.embedded`` (blocking: loads models and trains on the examples file).

        Raises:
            ConfigError: a bad examples file, a missing embedder or a model file that fails its hash check.
        """
        from ._models import EmbeddedModels  # it builds engines of this module

        models = EmbeddedModels(settings, cache_dir=cache_dir)
        return models.embedded_engine(models.file_examples())

    def _blend(
        self, vector: NDArray[np.float32] | None, question: Choice, probs: dict[str, float], stop: StopToken | None
    ) -> dict[str, float]:
        if vector is None or self.embedder is None or self._temperature is None:
            return probs
        texts = [option_text(o, d) for o, d in question.criteria.items()]
        # Option texts stay out of the disk cache: each new question would leave another small file.
        vectors = self._cache.embed(self.embedder, texts, persist=False, stop=stop)
        sims = (vectors @ vector).astype(np.float64) / self._temperature
        sim_p = np.exp(sims - sims.max())
        sim_p /= sim_p.sum()
        mixed = np.sqrt(np.array([probs[o] for o in question.options]) * sim_p)
        mixed /= mixed.sum()
        return {o: float(p) for o, p in zip(question.options, mixed, strict=True)}

    def _answer_all(
        self,
        state: State,
        trained: Mapping[str, Question],
        zero_shot: Mapping[str, Question],
        stop: StopToken | None = None,
        violations: Mapping[str, str] | None = None,
    ) -> tuple[dict[str, dict[str, float]], str | None, bool, dict[str, float | None]]:
        """Every distribution of one call (blocking, in steps that ``stop`` can end).

        Also the blended model name, whether a check's windows covered the whole state, and the
        trained questions' agreement between encoders (an ensemble's; ``None`` with one encoder).
        """
        needs_vector = bool(trained) or (
            self._temperature is not None and any(isinstance(q, Choice) for q in zero_shot.values())
        )
        vector = None
        whole = True
        out: dict[str, dict[str, float]] = {}
        agreements: dict[str, float | None] = {}
        if needs_vector and self.examples is not None:
            violations = violations or {}
            reading = self.examples.read(state, windows=any(n in violations for n in trained), stop=stop)
            vector = reading.ends
            whole = reading.whole
            for name, q in trained.items():
                out[name], agreements[name] = self.examples.answer(reading, name, q, violation=violations.get(name))
        elif needs_vector and self.embedder is not None:
            read = [ends(squash(as_text(state)), self.embedder.count_tokens)]
            if self.cache_states:
                vector = self._cache.embed_states(self.embedder, read, stop=stop)[0]
            else:
                vector = self.embedder.embed(read, stop=stop)[0]
        blended = None
        for name, q in zero_shot.items():
            if stop is not None:
                stop.check()
            blend = isinstance(q, Choice) and vector is not None and self._temperature is not None
            # Calibrated zero-shot (_zero_shot): sparrow's own for nouls, scores and unblended choices,
            # the blend's for blended choices (it is fitted on the blend of sparrow's raw distribution).
            probs = self.sparrow.read(state, q, calibrated=not blend, violation=(violations or {}).get(name), stop=stop)
            if blend:
                assert isinstance(q, Choice)
                probs = self._blend(vector, q, probs, stop)
                blended = f"{self.sparrow.model}*{self.embedder.name if self.embedder else ''}-similarity"
                probs = calibrate_zero_shot(probs, engine=self.name, model=blended, kind=q.kind)
            out[name] = probs
        return out, blended, whole, agreements

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """Answer every question about ``state``; see ``fastslow.router.engine_api.DecisionEngine``."""
        clean = check_call(self.name, self._closed, state, questions, images)
        return await with_budget(self._decide(clean, questions, options), options, engine=self.name)

    async def _decide(
        self, state: State, questions: Mapping[str, Question], options: ReadOptions | None
    ) -> EngineReply:
        started = time.perf_counter()
        trained = {n: q for n, q in questions.items() if self.examples and self.examples.uncovered(n, q) is None}
        rest = {n: q for n, q in questions.items() if n not in trained}
        first: dict[str, Answer | NoAnswer] = {}
        claimed: list[bool] = []

        async def ask(
            st: State, qs: Mapping[str, Question], _images: Sequence[Image], _options: ReadOptions
        ) -> EngineReply:
            # The first chunk also answers the trained questions, so one thread hop embeds the state once.
            extra: Mapping[str, Question] = {} if claimed else trained
            claimed.append(True)
            t0 = time.perf_counter()
            violations = options.violations if options is not None else None
            probs, blended, whole, agreements = await run_blocking(
                lambda stop: self._answer_all(st, extra, qs, stop, violations)
            )
            ms = (time.perf_counter() - t0) * 1000.0
            model = self.examples.model if self.examples else ""
            for name in extra:
                # A check's rule that read only the windows its token budget holds says so.
                read_all = whole if violations and name in violations else None
                first[name] = make_answer(
                    name,
                    questions[name],
                    probs[name],
                    engine=self.name,
                    model=model,
                    latency_ms=ms,
                    read_all=read_all,
                    agreement=agreements.get(name),
                )
            answers = {
                n: make_answer(
                    n,
                    q,
                    probs[n],
                    engine=self.name,
                    model=blended if blended and isinstance(q, Choice) else self.sparrow.model,
                    latency_ms=ms,
                )
                for n, q in qs.items()
            }
            return EngineReply(answers=answers, engine=self.name, model=self.sparrow.model, latency_ms=ms)

        if rest:
            reply = await split_and_ask(ask, self.limits, state, rest, options=options, engine=self.name)
            rest_answers = reply.answers
        else:
            await ask(state, {}, (), options or ReadOptions())
            rest_answers = {}
        elapsed = (time.perf_counter() - started) * 1000.0
        merged: dict[str, Answer | NoAnswer] = {}
        for name in questions:
            answer = first[name] if name in first else rest_answers[name]
            merged[name] = replace(answer, latency_ms=elapsed)
        models = list(dict.fromkeys(a.model for a in merged.values()))
        return EngineReply(answers=merged, engine=self.name, model=",".join(models), latency_ms=elapsed)

    async def aclose(self) -> None:
        self._closed = True
        if self.cache_states:  # the next evaluation, in this process or another, reads them
            await asyncio.to_thread(self._cache.flush)
