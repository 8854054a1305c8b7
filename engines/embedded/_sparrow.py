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

from ._common import as_text, check_call, make_answer, with_budget
from ._embedders import verify_sha256
from ._reading import CHECK_READ_CHARS, CHECK_WINDOW_CHARS, check_windows, ends, squash
from ._zero_shot import calibrate_zero_shot, shipped_zero_shot_calibrations

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
    limits = EngineLimits(max_score_levels=10, accepts_images=False, max_read_chars=CHECK_READ_CHARS)

    def __init__(self, model: str = DEFAULT_SPARROW_MODEL) -> None:
        import sparrow_decider

        if model not in SPARROW_MODELS:
            raise ConfigError(f"unknown sparrow model {model!r}; pinned: {sorted(SPARROW_MODELS)}", key="model")
        path = Path(sparrow_decider.__file__).parent / "models" / f"{model}.sparrow"
        verify_sha256(path, SPARROW_MODELS[model])
        self._decider = sparrow_decider.Decider.load(str(path))
        shipped_zero_shot_calibrations()  # a broken calibration file fails here, not on the first call
        self.model = model
        self._closed = False

    def probabilities(self, state: State, question: Question, *, calibrated: bool = True) -> dict[str, float]:
        """The model's distribution over ``question.options`` (blocking; microseconds to milliseconds).

        Calibrated with the shipped zero-shot calibration of this model and question type
        (``_zero_shot``); ``calibrated=False`` gives the model's own distribution, which
        ``bench/fit_zero_shot.py`` fits that calibration on.
        """
        wire: dict[str, Any] = question_to_wire(question)
        if isinstance(question, Noul):
            # Leave unset outcomes out so sparrow uses its own default descriptions.
            wire["criteria"] = {k: v for k, v in (("true", question.yes), ("false", question.no)) if v}
        _, names, _, p = self._decider.probs(state, wire)
        probs = {n: float(x) for n, x in zip(names, np.asarray(p, dtype=np.float64), strict=True)}
        if isinstance(question, Noul):
            probs = {"yes": probs["true"], "no": probs["false"]}
        if not calibrated:
            return probs
        return calibrate_zero_shot(probs, engine=self.name, model=self.model, kind=question.kind)

    def read(
        self,
        state: State,
        question: Question,
        *,
        calibrated: bool = True,
        violation: str | None = None,
        stop: StopToken | None = None,
    ) -> dict[str, float]:
        """``probabilities`` of what the engine reads of ``state`` (``_reading``): bounded, whatever its length.

        With ``violation`` (a policy check) the most violated window of a long state decides;
        otherwise its start and end are read.
        """
        text = squash(as_text(state))
        if violation is not None and len(text) > CHECK_WINDOW_CHARS:
            worst: dict[str, float] | None = None
            for piece in [ends(text), *check_windows(text)[0]]:
                if stop is not None:
                    stop.check()  # one window a step: a deadline ends a long check within one
                probs = self.probabilities(piece, question, calibrated=calibrated)
                if worst is None or probs.get(violation, 0.0) > worst.get(violation, 0.0):
                    worst = probs
            assert worst is not None
            return worst
        start_and_end = ends(text)
        # A state that fits is passed as it is (sparrow renders a mapping itself).
        return self.probabilities(state if start_and_end == text else start_and_end, question, calibrated=calibrated)

    def probabilities_many(
        self,
        state: State,
        questions: Mapping[str, Question],
        stop: StopToken | None = None,
        violations: Mapping[str, str] | None = None,
    ) -> dict[str, dict[str, float]]:
        """Every question's distribution, one question per step (``stop`` is checked between them)."""
        out: dict[str, dict[str, float]] = {}
        for name, q in questions.items():
            if stop is not None:
                stop.check()
            out[name] = self.read(state, q, violation=(violations or {}).get(name), stop=stop)
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
        self, state: State, questions: Mapping[str, Question], _images: Sequence[Image], options: ReadOptions
    ) -> EngineReply:
        started = time.perf_counter()
        probs = await run_blocking(lambda stop: self.probabilities_many(state, questions, stop, options.violations))
        elapsed = (time.perf_counter() - started) * 1000.0
        answers: dict[str, Answer] = {
            name: make_answer(name, q, probs[name], engine=self.name, model=self.model, latency_ms=elapsed)
            for name, q in questions.items()
        }
        return EngineReply(answers=answers, engine=self.name, model=self.model, latency_ms=elapsed)

    async def aclose(self) -> None:
        self._closed = True
