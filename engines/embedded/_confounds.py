"""Surface features that alone separate a yes/no question's examples: found at load, named in a warning.

A rule whose "yes" examples are all longer than its "no" ones learns length, and then judges every
long text a violation. Each feature below is scored by how well it alone ranks one option's
examples above the other's (AUROC); at ``CONFOUND_AUROC`` or beyond, the warning names the feature
and which side it favours, so the author can add examples that break it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ._examples import QuestionExamples

__all__ = ["CONFOUND_AUROC", "MIN_EXAMPLES", "confounds"]

CONFOUND_AUROC = 0.9
MIN_EXAMPLES = 5


def _share(text: str, test: Callable[[str], bool]) -> float:
    return sum(1 for c in text if test(c)) / max(1, len(text))


FEATURES: dict[str, tuple[Callable[[str], float], str, str]] = {
    # name -> (feature, what a high value reads as, what a low value reads as)
    "length": (lambda t: float(len(t)), "longer", "shorter"),
    "question marks": (lambda t: float("?" in t), "more often questions", "less often questions"),
    "capitals": (lambda t: _share(t, str.isupper), "more capitalised", "less capitalised"),
    "non-ASCII": (lambda t: _share(t, lambda c: ord(c) > 127), "more often non-ASCII", "more often ASCII"),
    "digits": (lambda t: _share(t, str.isdigit), "richer in digits", "poorer in digits"),
    "lines": (lambda t: float(t.count("\n")), "longer in lines", "shorter in lines"),
}


def _auroc(pos: Sequence[float], neg: Sequence[float]) -> float:
    scores = np.array([*pos, *neg])
    ranks = scores.argsort(kind="mergesort").argsort().astype(np.float64) + 1.0
    # Ties share their mean rank, so a constant feature scores 0.5, not a spurious separation.
    for value in np.unique(scores):
        tied = scores == value
        ranks[tied] = ranks[tied].mean()
    n_pos = len(pos)
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * len(neg)))


def confounds(q: QuestionExamples) -> list[str]:
    """Warnings for the features that alone separate a two-option question's examples."""
    if len(q.examples) != 2:
        return []
    (a, a_texts), (b, b_texts) = q.examples.items()
    if min(len(a_texts), len(b_texts)) < MIN_EXAMPLES:
        return []
    out: list[str] = []
    for name, (feature, high, low) in FEATURES.items():
        auc = _auroc([feature(t) for t in a_texts], [feature(t) for t in b_texts])
        if max(auc, 1.0 - auc) >= CONFOUND_AUROC:
            side = high if auc >= 0.5 else low
            out.append(
                f"question {q.name!r}: its {a!r} examples are {side} than its {b!r} ones "
                f"({name} alone separates them, AUROC {max(auc, 1.0 - auc):.2f}); the engine may learn "
                f"{name} instead of the question: add examples of each option that differ the other way"
            )
    return out
