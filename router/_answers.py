"""Answers: a probability for every option of one question, plus who produced it.

Confidence is always recomputed from the distribution (the top probability): servers compute their
own ``confidence`` differently (peak-based, entropy-based, mean top label), so we never trust it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._errors import EngineProtocolError
from ._questions import Question, QuestionKind

__all__ = [
    "Answer",
    "EngineReply",
    "NoAnswer",
    "Signals",
    "Usage",
    "normalise_distribution",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Signals:
    """Quality signals an engine reports for one answer, when it reports them."""

    label_mass: float | None = None
    """Probability mass the model put on the answer labels at all (structured reads)."""
    argmax_is_label: bool | None = None
    """Whether the model's single most likely token was one of the labels."""
    entropy: tuple[float, ...] = ()
    """Entropy of each read (noise draw) at the answer slot."""
    agreement: float | None = None
    """Share of reads whose top label equals the averaged top label."""
    read_all: bool | None = None
    """False when the engine read only part of the state (its read budget in tokens ran out before
    the state's end): a policy check then gets its task's ``on_oversize`` verdict unless a rule denies."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """The full distribution over one question's options."""

    question: str
    """The question's name in the call."""
    kind: QuestionKind
    probabilities: Mapping[str, float]
    """Option -> probability, over exactly the question's options, in option order, summing to 1."""
    engine: str
    model: str
    latency_ms: float = 0.0
    """Wall time of the engine call that produced this answer."""
    signals: Signals = field(default_factory=Signals)

    @property
    def top(self) -> str:
        """The most probable option (the first one on ties)."""
        return max(self.probabilities, key=lambda k: self.probabilities[k])

    @property
    def confidence(self) -> float:
        """The top option's probability, recomputed from the distribution."""
        return max(self.probabilities.values())

    @property
    def margin(self) -> float:
        """Top probability minus the runner-up's."""
        ranked = sorted(self.probabilities.values(), reverse=True)
        return ranked[0] - ranked[1]

    @property
    def expected(self) -> float | None:
        """For a score, the expected level (sum of i * p_i, 0-indexed); else ``None``."""
        if self.kind != "score":
            return None
        return sum(int(k) * p for k, p in self.probabilities.items())


@dataclass(frozen=True, slots=True, kw_only=True)
class NoAnswer:
    """An engine gave no usable answer to one question; the router escalates it."""

    question: str
    kind: QuestionKind
    reason: str
    """Why, such as ``null answer``, ``unsupported answer type 'box'`` or ``refusal``."""
    engine: str
    model: str
    latency_ms: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Tokens the engine reports for a call."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineReply:
    """What one ``DecisionEngine.decide`` call returns."""

    answers: Mapping[str, Answer | NoAnswer]
    """One entry for every question asked, keyed by question name, in the order asked."""
    engine: str
    model: str
    latency_ms: float
    usage: Usage = field(default_factory=Usage)


def normalise_distribution(question: Question, probs: Mapping[str, float], *, engine: str = "") -> dict[str, float]:
    """Return ``probs`` over exactly ``question.options``, in order, summing to 1.

    Servers send distributions that sum to 0.98 or 1.03 (rounding), omit labels they gave no mass,
    or add labels nobody asked for. Missing options get 0, unknown ones are dropped, and the rest
    is renormalised. A distribution with no finite positive mass cannot be repaired.
    """
    values: list[float] = []
    for option in question.options:
        raw = probs.get(option, 0.0)
        try:
            p = float(raw)
        except (TypeError, ValueError, OverflowError):
            shown = repr(raw)[:80]
            raise EngineProtocolError(f"probability of {option!r} is not a number: {shown}", engine=engine) from None
        values.append(p if math.isfinite(p) and p > 0.0 else 0.0)
    try:
        total = math.fsum(values)
    except OverflowError:  # a few weights near the float maximum: scale them down first
        peak = max(values)
        values = [v / peak for v in values]
        total = math.fsum(values)
    if total <= 0.0:
        raise EngineProtocolError("distribution has no probability mass on the offered options", engine=engine)
    return {option: p / total for option, p in zip(question.options, values, strict=True)}
