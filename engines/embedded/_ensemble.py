"""Two encoders that check each other: one example-trained engine per encoder, answers pooled.

fastslow ships two encoders that err differently (e5: multilingual, stronger on injections;
MiniLM: stronger on English intents). ``ExampleEnsemble`` reads a state with both and answers
each question from both encoders' heads:

* **Pooled distribution.** ``softmax((w * log p_a + (1 - w) * log p_b) / T)``, a weighted
  geometric pool. ``w`` and ``T`` are fitted per question on the heads' out-of-fold
  probabilities of the question's own training rows (``SoftmaxHead.oof``, ``AdaptedHead.oof``:
  each fold's head never saw the rows it predicts), as the adapted head fits its blend; a check
  fits them on its rows and background with their training weights. A check pools each
  encoder's worst window (their windows are cut by different tokenizers, so they need not align).
* **Joint open-set score.** The mean of the two encoders' open-set scores (a state's similarity to
  its nearest example in each encoder's centred view), calibrated like one encoder's
  (``_open_set``) on the examples' own out-of-fold scores, averaged the same way. (The nearest
  example in both views at once, the mean of the two cosines, separated CLINC150's out-of-scope
  rows less well: AUROC 0.895 against 0.907.)
* **Agreement.** ``Signals.agreement`` is the share of encoders whose own answer (its head and its
  own open-set score) has the pooled answer's top option: 1 when both agree, 0.5 or 0 when they
  do not. A policy escalates on it with ``min_agreement`` (1.0: escalate whenever they disagree),
  as on a Jev server's sample agreement.

Chosen on CLINC150's training and validation splits (10 domains, 50 examples a domain, the
validation split's out-of-scope rows weighted to the test split's share), never its test split:
the pool lifted in-scope accuracy from 0.894 (either encoder) to 0.911 and the out-of-scope
AUROC from 0.880 / 0.851 to 0.907; ``docs/benchmarks.md`` has the evaluation.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fastslow.router import Choice, Image, Question, ReadOptions, State
from fastslow.router.engine_api import EngineReply, StopToken

from ._example_engine import ExampleEngine, Reading, decide_covered, with_open_set
from ._head import _fit_temperature, _log_loss
from ._open_set import OpenSet, conformal_p, out_of_fold, out_of_scope
from ._training import TrainedQuestion

__all__ = ["POOL_WEIGHTS", "ExampleEnsemble", "JointOpenSet", "Pool", "fit_joint_open_set", "fit_pool"]

F64 = NDArray[np.float64]

POOL_WEIGHTS: tuple[float, ...] = tuple(i / 10 for i in range(11))
"""The first encoder's weights tried (the second gets the rest)."""
_READERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fastslow-ensemble")
"""Where second encoders read (as many as ``run_blocking``'s own threads: one per blocking read)."""
_FLOOR = 1e-9
"""Smallest probability pooled: a head's hard zero must not veto the other encoder."""


def _log(p: F64) -> F64:
    out: F64 = np.log(np.maximum(p, _FLOOR))
    return out


@dataclass(frozen=True, slots=True)
class Pool:
    """``softmax((weight * log a + (1 - weight) * log b) / temperature)``, row by row."""

    weight: float = 0.5
    temperature: float = 1.0

    def combine(self, a: F64, b: F64) -> F64:
        logits = (self.weight * _log(a) + (1.0 - self.weight) * _log(b)) / self.temperature
        logits -= logits.max(axis=-1, keepdims=True)
        e = np.exp(logits)
        out: F64 = e / e.sum(axis=-1, keepdims=True)
        return out


def fit_pool(a: F64 | None, b: F64 | None, targets: NDArray[np.intp] | None, weights: F64 | None = None) -> Pool:
    """The pool with the lowest (weighted) log loss on out-of-fold ``a`` and ``b``; even without them."""
    if a is None or b is None or targets is None or a.shape != b.shape or len(targets) != len(a):
        return Pool()
    best: tuple[float, Pool] | None = None
    for weight in POOL_WEIGHTS:
        logits = weight * _log(a) + (1.0 - weight) * _log(b)
        temperature = _fit_temperature(logits, targets, weights)
        loss = _log_loss(logits / temperature, targets, weights)
        if math.isfinite(loss) and (best is None or loss < best[0] - 1e-9):
            best = (loss, Pool(weight, temperature))
    return best[1] if best is not None else Pool()


@dataclass(frozen=True, slots=True)
class JointOpenSet:
    """The open-set score over both encoders' views (see the module's docstring)."""

    reference: F64
    """The examples' out-of-fold joint similarities, sorted."""
    rate: float

    def p_out(self, scores: Sequence[float]) -> float:
        """The probability that a state is out of scope, from each encoder's open-set score for it."""
        score = np.array([sum(scores) / len(scores)])
        return float(out_of_scope(conformal_p(score, self.reference), self.rate)[0])


def fit_joint_open_set(members: Sequence[OpenSet], targets: NDArray[np.intp]) -> JointOpenSet:
    """Calibrate the joint score on the members' own examples (they list them in the same order)."""
    reference = sum((out_of_fold(m.examples, targets) for m in members), start=np.zeros(len(targets)))
    return JointOpenSet(reference=np.sort(reference / len(members)), rate=members[0].rate)


@dataclass(frozen=True, slots=True)
class _Pooled:
    pool: Pool
    open_set: JointOpenSet | None


def _pooled(trained: Sequence[TrainedQuestion]) -> _Pooled:
    a, b = trained
    pool = fit_pool(a.head.oof, b.head.oof, a.targets, a.weights)
    open_set = None
    if a.open_set is not None and b.open_set is not None and a.targets is not None:
        if len(a.open_set.examples) == len(b.open_set.examples) == len(a.targets):
            open_set = fit_joint_open_set((a.open_set, b.open_set), a.targets)
    return _Pooled(pool, open_set)


class ExampleEnsemble:
    """Answers the questions its examples cover from two example-trained engines (see the module).

    Both members must have been trained on the same examples (``EmbeddedModels.example_engine``
    builds them so); construction only fits the pools and joint open-set scores, in milliseconds
    for a few hundred examples.
    """

    name = "examples"

    def __init__(self, members: Sequence[ExampleEngine]) -> None:
        if len(members) != 2:
            raise ValueError("an ensemble has two encoders")
        first, second = members
        if first.examples.questions.keys() != second.examples.questions.keys():
            raise ValueError("the ensemble's encoders must be trained on the same examples")
        self.members = (first, second)
        self.examples = first.examples
        self.examples_versions: Mapping[str, str] = first.examples_versions
        self.embedder = first.embedder
        """The first encoder: what the zero-shot blend of ``EmbeddedEngine`` reads with."""
        self.limits = first.limits
        self.cache_states = first.cache_states
        self.model = "+".join(m.embedder.name for m in self.members) + "+head"
        self.heads = first.heads
        self.heads_trained = first.heads_trained + second.heads_trained
        self._pooled = {name: _pooled((first.trained[name], second.trained[name])) for name in first.trained}
        self._closed = False

    def pool(self, name: str) -> Pool:
        """The pool fitted for question ``name``."""
        return self._pooled[name].pool

    def uncovered(self, name: str, question: Question) -> str | None:
        return self.members[0].uncovered(name, question)

    def read(self, state: State, *, windows: bool, stop: StopToken | None = None) -> Reading:
        """Each encoder's reading of ``state`` (blocking), the first's also at the top level.

        The second encoder reads in a thread of its own meanwhile (both models release the GIL),
        in this thread's context (the request's tenant and deadline).
        """
        first_member, second_member = self.members
        context = contextvars.copy_context()
        second = _READERS.submit(context.run, partial(second_member.read, state, windows=windows, stop=stop))
        # If the first read fails or stops, the second stops at the same token: no need to wait for it.
        first = first_member.read(state, windows=windows, stop=stop)
        readings = (first, second.result())
        return Reading(ends=first.ends, windows=first.windows, whole=all(r.whole for r in readings), members=readings)

    def probabilities(
        self, reading: Reading, name: str, question: Question, *, violation: str | None = None
    ) -> dict[str, float]:
        return self.answer(reading, name, question, violation=violation)[0]

    def answer(
        self, reading: Reading, name: str, question: Question, *, violation: str | None = None
    ) -> tuple[dict[str, float], float]:
        """The pooled distribution for ``name``, and the share of encoders whose own top option it has."""
        if len(reading.members) != len(self.members):
            raise ValueError("an ensemble answers from its own readings (ExampleEnsemble.read)")
        pooled = self._pooled[name]
        first = self.members[0].trained[name]
        readings = list(zip(self.members, reading.members, strict=True))
        scores: list[float] = []
        if violation is not None:
            # Each encoder's worst window, pooled.
            own = [m.probabilities(r, name, question, violation=violation) for m, r in readings]
            parts = [np.array([p[label] for label in first.head.labels]) for p in own]
        else:
            # Each encoder's head and open-set score, computed once: for its own answer and for the pool.
            both = [m.choice_parts(r, name, question) for m, r in readings]
            own = [
                m.choice_answer(name, question, head, score)
                for (m, _), (head, score) in zip(readings, both, strict=True)
            ]
            parts = [head for head, _ in both]
            known = [score for _, score in both if score is not None]
            scores = known if len(known) == len(both) else []
        p = pooled.pool.combine(parts[0], parts[1])
        probs = {label: float(x) for label, x in zip(first.head.labels, p, strict=True)}
        if pooled.open_set is not None and isinstance(question, Choice) and scores:
            probs = with_open_set(first, question, probs, pooled.open_set.p_out(scores))
        top = max(probs, key=lambda k: probs[k])
        agreement = sum(1 for p_m in own if max(p_m, key=lambda k: p_m[k]) == top) / len(own)
        return probs, agreement

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
        await asyncio.gather(*(m.aclose() for m in self.members))

    def describe(self) -> dict[str, Any]:
        """The fitted pools, for people reading logs and tests."""
        return {
            name: {"weight": p.pool.weight, "temperature": p.pool.temperature, "joint_open_set": p.open_set is not None}
            for name, p in self._pooled.items()
        }
