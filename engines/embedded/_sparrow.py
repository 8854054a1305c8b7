"""Zero-shot decisions with sparrow-decider: a few-MB static-embedding model, numpy only."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastslow.router import Answer, ConfigError, Image, Noul, Question, ReadOptions, State
from fastslow.router.engine_api import (
    EngineLimits,
    EngineReply,
    StopToken,
    question_to_wire,
    run_blocking,
    split_and_ask,
)

from ._common import check_call, make_answer, with_budget
from ._embedders import verify_sha256

__all__ = ["SPARROW_MODELS", "SparrowEngine"]

SPARROW_MODELS: dict[str, str] = {
    # Files bundled with sparrow-decider 0.2.0 and their sha256.
    "sparrow-nano-general-v1.1": "d1d3ee04cdfa58f325bb7f06b701df92bc29a3debea59743bf14a7a6215ef2e3",
    "sparrow-nano-robot-v1.2": "0fe7a7fee5b369c02c760e2c33c115b72e16a6a0a98e911ee5fea53a25248608",
}
DEFAULT_SPARROW_MODEL = "sparrow-nano-general-v1.1"


class SparrowEngine:
    """Answers any noul, choice or score zero-shot, from its instructions and option texts.

    All questions of a call run in one worker thread, so the event loop is never blocked.
    Scores take at most 10 levels; longer ones are split by ``fastslow.router.engine_api.split_and_ask``.

    Args:
        model: one of ``SPARROW_MODELS``; the bundled file must match its pinned hash.
    """

    name = "sparrow"
    limits = EngineLimits(max_score_levels=10, accepts_images=False)

    def __init__(self, model: str = DEFAULT_SPARROW_MODEL) -> None:
        import sparrow_decider

        if model not in SPARROW_MODELS:
            raise ConfigError(f"unknown sparrow model {model!r}; pinned: {sorted(SPARROW_MODELS)}", key="model")
        path = Path(sparrow_decider.__file__).parent / "models" / f"{model}.sparrow"
        verify_sha256(path, SPARROW_MODELS[model])
        self._decider = sparrow_decider.Decider.load(str(path))
        self.model = model
        self._closed = False

    def probabilities(self, state: State, question: Question) -> dict[str, float]:
        """The model's distribution over ``question.options`` (blocking; microseconds to milliseconds)."""
        wire: dict[str, Any] = question_to_wire(question)
        if isinstance(question, Noul):
            # Leave unset outcomes out so sparrow uses its own default descriptions.
            wire["criteria"] = {k: v for k, v in (("true", question.yes), ("false", question.no)) if v}
        _, names, _, p = self._decider.probs(state, wire)
        probs = {n: float(x) for n, x in zip(names, np.asarray(p, dtype=np.float64), strict=True)}
        if isinstance(question, Noul):
            return {"yes": probs["true"], "no": probs["false"]}
        return probs

    def probabilities_many(
        self, state: State, questions: Mapping[str, Question], stop: StopToken | None = None
    ) -> dict[str, dict[str, float]]:
        """Every question's distribution, one question per step (``stop`` is checked between them)."""
        out: dict[str, dict[str, float]] = {}
        for name, q in questions.items():
            if stop is not None:
                stop.check()
            out[name] = self.probabilities(state, q)
        return out

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
        call = split_and_ask(self._ask, self.limits, clean, questions, options=options, engine=self.name)
        return await with_budget(call, options, engine=self.name)

    async def _ask(
        self, state: State, questions: Mapping[str, Question], _images: Sequence[Image], _options: ReadOptions
    ) -> EngineReply:
        started = time.perf_counter()
        probs = await run_blocking(lambda stop: self.probabilities_many(state, questions, stop))
        elapsed = (time.perf_counter() - started) * 1000.0
        answers: dict[str, Answer] = {
            name: make_answer(name, q, probs[name], engine=self.name, model=self.model, latency_ms=elapsed)
            for name, q in questions.items()
        }
        return EngineReply(answers=answers, engine=self.name, model=self.model, latency_ms=elapsed)

    async def aclose(self) -> None:
        self._closed = True
