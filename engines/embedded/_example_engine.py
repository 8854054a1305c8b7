"""Decisions learned from labelled examples: embeddings plus a calibrated head per question."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from fastslow.router import Answer, Choice, ConfigError, Image, NoAnswer, Question, ReadOptions, State
from fastslow.router.engine_api import EngineLimits, EngineReply, StopToken, run_blocking
from fastslow.router.settings import EmbeddedSettings

from ._background import Background, load_background
from ._cache import EmbeddingCache
from ._common import as_text, check_call, make_answer, with_budget
from ._confounds import confounds
from ._embedders import Embedder
from ._examples import ExampleSet, QuestionExamples, load_examples
from ._head_store import HeadStore
from ._open_set import OPEN_SET_RATE
from ._reading import CHECK_READ_CHARS, CHECK_READ_TOKENS, CHECK_WINDOW_CHARS, READ_TOKENS, check_reading, ends, squash
from ._training import HeadKind, TrainedQuestion, recipe, train_question

if TYPE_CHECKING:
    from ._ensemble import ExampleEnsemble

__all__ = ["Covering", "ExampleEngine", "Reading", "decide_covered", "with_open_set"]

log = logging.getLogger("fastslow.embedded")


@dataclass(frozen=True, slots=True)
class Reading:
    """A state as the engine read it: the start-and-end embedding, and one per check window."""

    ends: NDArray[np.float32]
    """Shape ``(dim,)``: what questions are answered from, except a policy check's."""
    windows: NDArray[np.float32]
    """Shape ``(n, dim)``, the ends first: a policy check's question takes its most violated row."""
    whole: bool = True
    """Whether the windows cover the whole state; else a check read only as many as its token budget holds."""
    members: tuple[Reading, ...] = ()
    """An ensemble's reading: each encoder's own (the fields above are its first encoder's)."""


class ExampleEngine:
    """Answers the questions its examples file covers; every other question gets a ``NoAnswer``.

    At construction every example is embedded (through the on-disk cache, so a restart runs no
    model) and one head is trained per question (``_training``), or loaded from the head store
    when the same examples were trained on before with the same model; questions with identical
    examples share a head. Construction blocks: call it from a worker thread in async code.
    ``EmbeddedEngine`` sends the questions this engine does not cover to the zero-shot engine.

    Args:
        examples: the labelled examples, from ``load_examples`` or ``examples_from_mapping``.
        embedder: the sentence embedder (``load_embedder``).
        cache: where example embeddings are kept; a cache in the user cache directory when omitted.
        background: the ordinary text policy-check rules also learn from; the shipped one when
            omitted and a rule needs it.
        store: where trained heads are kept; ``<cache directory>/_heads`` when omitted.
        open_set_rate: the open-set score's rate (``_open_set``); 0 turns the score off.
        use_background: whether policy-check rules learn against the background.
        head: ``adapted`` adapts a choice's head to its examples (``_adapted``); ``softmax`` does not.
        cache_states: keep what it reads of states in ``cache`` too (``EmbeddingCache.embed_states``),
            for offline evaluation; off when serving, where states are users' requests.
        check_read_tokens: the most tokens of its windows a policy check reads (``_reading``); past
            them the answer says it read part of the state.
    """

    name = "examples"
    limits = EngineLimits(
        accepts_images=False, max_read_chars=CHECK_READ_CHARS, max_read_tokens=READ_TOKENS + CHECK_READ_TOKENS
    )

    def __init__(
        self,
        examples: ExampleSet,
        embedder: Embedder,
        *,
        cache: EmbeddingCache | None = None,
        background: Background | None = None,
        store: HeadStore | None = None,
        open_set_rate: float = OPEN_SET_RATE,
        use_background: bool = True,
        head: HeadKind = "adapted",
        cache_states: bool = False,
        check_read_tokens: int = CHECK_READ_TOKENS,
    ) -> None:
        self.examples = examples
        self.cache_states = cache_states
        self.check_read_tokens = check_read_tokens
        self.limits = replace(ExampleEngine.limits, max_read_tokens=READ_TOKENS + check_read_tokens)
        self.examples_versions: Mapping[str, str] = examples.versions
        """Task -> the learned examples' version this engine was trained with (decisions record it)."""
        self.embedder = embedder
        self.model = f"{embedder.name}+head"
        self._cache = cache if cache is not None else EmbeddingCache()
        self._store = store if store is not None else HeadStore(self._cache.directory / "_heads")
        self._background = background
        self._use_background = use_background
        self._closed = False
        self.heads_trained = 0
        """Heads trained (not loaded from the store) by this instance."""
        started = time.perf_counter()
        texts = sorted({squash(t) for q in examples.questions.values() for ts in q.examples.values() for t in ts})
        vectors: NDArray[np.float32] | None = None
        by_fingerprint: dict[str, TrainedQuestion] = {}
        self.trained: dict[str, TrainedQuestion] = {}
        for name, q in examples.questions.items():
            for warning in confounds(q):
                log.warning("%s%s", f"{examples.source}: " if examples.source else "", warning)
            squashed = _squashed(q)
            done = by_fingerprint.get(squashed.fingerprint)
            if done is None:
                background = self._background_for(squashed)
                key = HeadStore.key(recipe(squashed, embedder.model_id, background, open_set_rate, head))
                arrays = self._store.load(key)
                if arrays is not None:
                    done = TrainedQuestion.from_arrays(arrays)
                else:
                    if vectors is None:
                        vectors = self._cache.embed(embedder, texts)
                    done = train_question(squashed, texts, vectors, background, open_set_rate=open_set_rate, head=head)
                    self.heads_trained += 1
                    self._store.save(key, done.to_arrays())
                by_fingerprint[squashed.fingerprint] = done
            self.trained[name] = done
        self.heads = {name: t.head for name, t in self.trained.items()}
        log.info(
            "example heads with %s: %d trained, %d loaded, in %.2f s (%d example texts)",
            embedder.name,
            self.heads_trained,
            len(by_fingerprint) - self.heads_trained,
            time.perf_counter() - started,
            len(texts),
        )

    def _background_for(self, q: QuestionExamples) -> Background | None:
        """The background if ``q`` learns from it, loaded on first need."""
        if not self._use_background or q.violation is None or not q.background or set(q.options) != {"yes", "no"}:
            return None
        if self._background is None:
            self._background = load_background(self.embedder, self._cache)
        return self._background

    @classmethod
    def from_file(cls, path: str | Path, embedder: Embedder, *, cache: EmbeddingCache | None = None) -> ExampleEngine:
        """Load an examples file (JSON or YAML) and train on it."""
        return cls(load_examples(path), embedder, cache=cache)

    @classmethod
    def from_settings(
        cls, settings: EmbeddedSettings, *, cache_dir: Path | None = None
    ) -> ExampleEngine | ExampleEnsemble:
        """Build from ``Settings.embedded``, whose ``examples`` must be set (blocking); an ensemble
        when ``settings.embedder`` names two encoders.

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
        # A head answers a question whose options include all it was trained on; an option without
        # examples is the "none of these" option when the policy names it so, or when it is the
        # only one: the open-set score gives it its probability.
        if not set(head.labels) <= set(question.options):
            return (
                f"the examples for {name!r} have options {sorted(head.labels)}, "
                f"the question has {sorted(question.options)}"
            )
        return None

    def read(self, state: State, *, windows: bool, stop: StopToken | None = None) -> Reading:
        """Embed what the engine reads of ``state`` (blocking; stops when ``stop`` says).

        ``windows``: also embed every check window, for policy checks. States reach the disk cache
        only with ``cache_states``.
        """
        text = squash(as_text(state))
        # Priced before any model work, in the tokens of the encoder that reads it (_reading).
        count = self.embedder.count_tokens
        pieces = [ends(text, count)]
        whole = True
        if windows and len(text) > CHECK_WINDOW_CHARS:
            planned = check_reading(text, count, budget=self.check_read_tokens)
            pieces += planned.windows
            whole = planned.whole
        if self.cache_states:
            vectors = self._cache.embed_states(self.embedder, pieces, stop=stop)
        else:
            vectors = self.embedder.embed(pieces, stop=stop)
        return Reading(ends=vectors[0], windows=vectors, whole=whole)

    def embed_state(self, state: State, stop: StopToken | None = None) -> NDArray[np.float32]:
        """The embedding choices are answered from (blocking)."""
        return self.read(state, windows=False, stop=stop).ends

    def probabilities(
        self,
        reading: Reading | NDArray[np.float32],
        name: str,
        question: Question,
        *,
        violation: str | None = None,
    ) -> dict[str, float]:
        """The distribution for question ``name`` given what was read of the state.

        With ``violation`` (a policy check), the window most likely violated decides. Otherwise a
        choice adds its open-set probability to its "none of these" option, or flattens towards
        uniform without one.
        """
        if not isinstance(reading, Reading):
            reading = Reading(ends=reading, windows=reading[None, :])
        trained = self.trained[name]
        head = trained.head
        if violation is not None:
            rows = head.probabilities(reading.windows)
            p = rows[int(rows[:, head.labels.index(violation)].argmax())] if violation in head.labels else rows[0]
            return {label: float(x) for label, x in zip(head.labels, p, strict=True)}
        return self.choice_answer(name, question, *self.choice_parts(reading, name, question))

    def choice_parts(self, reading: Reading, name: str, question: Question) -> tuple[NDArray[np.float64], float | None]:
        """What a question that is not a check is answered from: the head's distribution over its
        labels for the state's ends, and, for a choice with an open-set score, that score."""
        trained = self.trained[name]
        x = reading.ends[None, :]
        open_set = trained.open_set if isinstance(question, Choice) else None
        score = float(open_set.scores(x)[0]) if open_set is not None else None
        return trained.head.probabilities(x)[0], score

    def choice_answer(
        self, name: str, question: Question, head: NDArray[np.float64], score: float | None
    ) -> dict[str, float]:
        """The distribution ``choice_parts`` leads to: the head's, with the open-set probability added."""
        trained = self.trained[name]
        probs = {label: float(x) for label, x in zip(trained.head.labels, head, strict=True)}
        if score is None or trained.open_set is None or not isinstance(question, Choice):
            return probs
        return with_open_set(trained, question, probs, float(trained.open_set.p_out_of(np.array([score]))[0]))

    def answer(
        self, reading: Reading, name: str, question: Question, *, violation: str | None = None
    ) -> tuple[dict[str, float], float | None]:
        """``probabilities``, and the share of encoders that agree with it: none here (one encoder)."""
        return self.probabilities(reading, name, question, violation=violation), None

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """Answer the covered questions about ``state``; see ``fastslow.router.engine_api.DecisionEngine``."""
        return await decide_covered(self, self._closed, state, questions, images, options)

    async def aclose(self) -> None:
        self._closed = True
        if self.cache_states:  # the next evaluation, in this process or another, reads them
            await asyncio.to_thread(self._cache.flush)


def _squashed(q: QuestionExamples) -> QuestionExamples:
    """``q`` with its examples' whitespace squashed, as states are read."""
    examples = {o: tuple(dict.fromkeys(squash(t) for t in ts)) for o, ts in q.examples.items()}
    return QuestionExamples(
        name=q.name, examples=examples, none_option=q.none_option, violation=q.violation, background=q.background
    )


class Covering(Protocol):
    """What ``decide_covered`` needs of an example-trained engine (``ExampleEngine``, ``ExampleEnsemble``)."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str: ...
    def uncovered(self, name: str, question: Question) -> str | None: ...
    def read(self, state: State, *, windows: bool, stop: StopToken | None = None) -> Reading: ...
    def answer(
        self, reading: Reading, name: str, question: Question, *, violation: str | None = None
    ) -> tuple[dict[str, float], float | None]: ...


async def decide_covered(
    engine: Covering,
    closed: bool,
    state: State,
    questions: Mapping[str, Question],
    images: Sequence[Image],
    options: ReadOptions | None,
) -> EngineReply:
    """``engine.decide``: the questions it covers answered from one reading of ``state`` within the
    call's budget, a ``NoAnswer`` for the rest."""
    clean = check_call(engine.name, closed, state, questions, images)
    violations = (options.violations if options is not None else None) or {}
    return await with_budget(_answered(engine, clean, questions, violations), options, engine=engine.name)


async def _answered(
    engine: Covering, state: State, questions: Mapping[str, Question], violations: Mapping[str, str]
) -> EngineReply:
    started = time.perf_counter()
    reasons = {name: engine.uncovered(name, q) for name, q in questions.items()}
    covered = [name for name, r in reasons.items() if r is None]
    reading = None
    if covered:
        windows = any(n in violations for n in covered)
        reading = await run_blocking(lambda stop: engine.read(state, windows=windows, stop=stop))
    elapsed = (time.perf_counter() - started) * 1000.0
    answers: dict[str, Answer | NoAnswer] = {}
    for name, q in questions.items():
        reason = reasons[name]
        if reason is None and reading is not None:
            violation = violations.get(name)
            probs, agreement = engine.answer(reading, name, q, violation=violation)
            answers[name] = make_answer(
                name,
                q,
                probs,
                engine=engine.name,
                model=engine.model,
                latency_ms=elapsed,
                read_all=reading.whole if violation is not None else None,
                agreement=agreement,
            )
        else:
            answers[name] = NoAnswer(
                question=name,
                kind=q.kind,
                reason=reason or "no answer",
                engine=engine.name,
                model=engine.model,
                latency_ms=elapsed,
            )
    return EngineReply(answers=answers, engine=engine.name, model=engine.model, latency_ms=elapsed)


def with_open_set(
    trained: TrainedQuestion, question: Choice, probs: Mapping[str, float], out_of_scope: float
) -> dict[str, float]:
    """``probs`` with ``out_of_scope`` given to the "none of these" option, or spread evenly without one."""
    none = _none_option(trained, question)
    if none is not None:
        scaled = {o: (1.0 - out_of_scope) * probs.get(o, 0.0) for o in question.options}
        scaled[none] += out_of_scope
        return scaled
    uniform = out_of_scope / len(probs)
    return {o: (1.0 - out_of_scope) * v + uniform for o, v in probs.items()}


def _none_option(trained: TrainedQuestion, question: Choice) -> str | None:
    """The option the open-set probability goes to, if the question has one."""
    if trained.none_option is not None and trained.none_option in question.criteria:
        return trained.none_option
    missing = [o for o in question.options if o not in trained.head.labels]
    return missing[0] if len(missing) == 1 else None
