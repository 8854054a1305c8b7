"""The figures ``bench/fit_zero_shot.py`` scores a set by: accuracy, ECE and its floor, AUROC, Brier skill.

Its own module so that ``fit_zero_shot.py`` stays small; ``fit_zero_shot.py`` re-exports ``ece_floor``,
which tests/test_zero_shot_calibration.py reads from there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
from _zero_shot_forms import F64
from _zero_shot_sets import NONE, Item

from fastslow.policies.evaluation import auroc, brier, ece, log_loss
from fastslow.router import Noul

MIN_CONFIDENCE = 0.7
"""The shipped policy's default ``min_confidence``: an answer under it escalates."""


def _base_rates(items: Sequence[Item], key: Any) -> list[F64]:
    """Each item's reference forecast: the label frequencies of the items sharing its ``key(item)``."""
    by_key: dict[Any, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        by_key[(key(item), item.options)].append(i)
    base: list[F64] = [np.zeros(0)] * len(items)
    for (_, options), idx in by_key.items():
        counts = np.zeros(len(options))
        for i in idx:
            counts[options.index(items[i].label)] += 1
        for i in idx:
            base[i] = counts / counts.sum()
    return base


def _skill(briers: Sequence[float], refs: Sequence[float]) -> float:
    ref = float(np.mean(refs))
    return 1.0 - float(np.mean(briers)) / ref if ref > 0 else math.nan


ECE_FLOOR_DRAWS = 200


def ece_floor(confidence: Sequence[float]) -> float:
    """The ECE a perfectly calibrated model with these confidences would show on this many rows.

    Binned ECE is biased upwards on a finite sample: each bin's accuracy scatters about its
    confidence by sqrt(c (1 - c) / n_b), and the absolute values add up. On 1,000 rows at about 60 %
    that scatter alone reads as 0.03 to 0.04, most of a 0.05 target. Mean over seeded draws of
    right ~ Bernoulli(confidence), the same bins.
    """
    c = np.asarray(confidence, dtype=np.float64)
    rng = np.random.default_rng(0)
    return float(np.mean([ece(c, rng.random(len(c)) < c) for _ in range(ECE_FLOOR_DRAWS)]))


def figures(items: Sequence[Item], probs: Sequence[dict[str, float]], *, floor: bool = False) -> dict[str, Any]:
    """Rows, accuracy, ECE, AUROC, Brier and Brier skill scores; with ``floor``, the ECE's ``ece_floor`` too
    (200 seeded draws: only for the figures shown, not for every fit the form selection scores).

    ``brier_skill`` is against the base rates of the whole set (one forecast of its label
    frequencies for every row); ``brier_skill_per_question`` against each question's own (the
    same but for moderation, whose eight rules have their own base rates).
    """
    conf, right, briers, losses = [], [], [], []
    yes_scores: list[float] = []
    yes_truth: list[bool] = []
    per_set = _base_rates(items, lambda it: it.group)
    per_question = _base_rates(items, lambda it: (it.group, it.question_name))
    refs, refs_q = [], []
    for i, (item, p) in enumerate(zip(items, probs, strict=True)):
        options = item.options
        vec = np.array([p[o] for o in options])
        vec = vec / vec.sum()
        y = options.index(item.label)
        top = int(vec.argmax())
        conf.append(float(vec[top]))
        right.append(top == y)
        briers.append(brier(vec[None, :], [y]))
        refs.append(brier(per_set[i][None, :], [y]))
        refs_q.append(brier(per_question[i][None, :], [y]))
        losses.append(log_loss(vec[None, :], [y]))
        if isinstance(item.question, Noul):
            yes_scores.append(p["yes"])
            yes_truth.append(item.label == "yes")
    noul = bool(yes_scores) and len(yes_scores) == len(items)
    return {
        "rows": len(items),
        "accuracy": float(np.mean(right)),
        "mean_confidence": float(np.mean(conf)),
        "ece": ece(conf, right),
        "ece_floor": ece_floor(conf) if floor else None,
        "auroc": auroc(yes_scores, yes_truth) if noul else auroc(conf, right),
        "auroc_of": "P(yes) for yes rows" if noul else "confidence for right answers",
        "confidence_auroc": auroc(conf, right),
        "brier": float(np.mean(briers)),
        "brier_skill": _skill(briers, refs),
        "brier_skill_per_question": _skill(briers, refs_q),
        "log_loss": float(np.mean(losses)),
        "base_rate_yes": float(np.mean(yes_truth)) if noul else None,
        "mean_p_yes": float(np.mean(yes_scores)) if noul else None,
        "oos_auroc": _oos_auroc(items, probs),
        "under_min_confidence": float(np.mean(np.array(conf) < MIN_CONFIDENCE)),
    }


def _oos_auroc(items: Sequence[Item], probs: Sequence[dict[str, float]]) -> float | None:
    """AUROC of P(none_of_these) for the out-of-scope rows, as ``fastslow eval`` reports it; ``None`` without one."""
    pairs = [(p[NONE] / sum(p.values()), it.label == NONE) for it, p in zip(items, probs, strict=True) if NONE in p]
    if not pairs or len(pairs) < len(items):
        return None
    return auroc([s for s, _ in pairs], [t for _, t in pairs])


def _r(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, 4)
    if isinstance(x, dict):
        return {k: _r(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_r(v) for v in x]
    return x
