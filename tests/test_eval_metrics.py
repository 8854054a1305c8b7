"""Metrics of ``fastslow eval`` against values worked out by hand, edge cases and invariants."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import get_args

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from fastslow.policies.evaluation import _metrics as m
from fastslow.router import Verdict

# -- labels --------------------------------------------------------------------------------------------


def test_accuracy_plain_and_weighted() -> None:
    truth, predicted = ["a", "b", "c", "a"], ["a", "b", "a", "a"]
    assert m.accuracy(truth, predicted) == 3 / 4
    # rows 0 and 1 right (weight 1 + 1), row 2 wrong (2), row 3 right but weight 0
    assert m.accuracy(truth, predicted, weight=[1, 1, 2, 0]) == pytest.approx((1 + 1) / (1 + 1 + 2 + 0))
    assert m.accuracy(truth, predicted, weight=[1, 1, 1, 1]) == m.accuracy(truth, predicted)


def test_accuracy_all_right_and_all_wrong() -> None:
    assert m.accuracy([0, 1, 2], [0, 1, 2]) == 1.0
    assert m.accuracy([0, 1, 2], [1, 2, 0]) == 0.0


def test_macro_f1_by_hand() -> None:
    # a: tp 1, predicted 1, true 2 -> P 1, R 1/2, F1 2/3
    # b: tp 1, predicted 3, true 1 -> P 1/3, R 1, F1 1/2
    # c: never predicted -> P 0, F1 0
    assert m.macro_f1(["a", "a", "b", "c"], ["a", "b", "b", "b"]) == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)


def test_macro_f1_counts_labels_only_predicted() -> None:
    # d is never true: recall 0, precision 0, F1 0; it still counts in the mean
    assert m.macro_f1(["a", "a"], ["a", "d"]) == pytest.approx((2 / 3 + 0) / 2)
    assert m.macro_f1([1, 2, 3], [1, 2, 3]) == 1.0


def test_confusion_counts_and_worst_pairs() -> None:
    truth = ["a", "a", "a", "b", "b", "c"]
    predicted = ["b", "b", "c", "a", "b", "c"]
    result = m.confusion(truth, predicted, worst=2)
    assert result.labels == ("a", "b", "c")
    assert result.counts.tolist() == [[0, 2, 1], [1, 1, 0], [0, 0, 1]]
    # a->b twice; a->c and b->a tie at 1, broken by label order
    assert result.worst == (("a", "b", 2), ("a", "c", 1))


def test_confusion_label_order_and_unused_labels() -> None:
    result = m.confusion(["a", "b"], ["b", "b"], labels=["c", "b", "a"])
    assert result.labels == ("c", "b", "a")
    assert result.counts.tolist() == [[0, 0, 0], [0, 1, 0], [0, 1, 0]]
    assert result.worst == (("a", "b", 1),)
    assert m.confusion([1, 2], [1, 2]).worst == ()
    with pytest.raises(ValueError, match="not in the given label list"):
        m.confusion(["a", "z"], ["a", "a"], labels=["a", "b"])
    with pytest.raises(ValueError, match="duplicates"):
        m.confusion(["a"], ["a"], labels=["a", "a"])


# -- calibration -------------------------------------------------------------------------------------


def test_ece_by_hand() -> None:
    confidence, correct = [0.9, 0.8, 0.6, 0.3], [1, 1, 0, 0]
    # bins [0, .5) and [.5, 1]: upper bin 3 rows, |2/3 - 2.3/3| = 0.1; lower bin 1 row, |0 - .3|
    assert m.ece(confidence, correct, bins=2) == pytest.approx(3 / 4 * 0.1 + 1 / 4 * 0.3)
    # weights 2, 1, 1, 0: upper bin |(2 + 1) - (1.8 + .8 + .6)| / 4; the lower bin weighs nothing
    assert m.ece(confidence, correct, bins=2, weight=[2, 1, 1, 0]) == pytest.approx(abs(3 - 3.2) / 4)


def test_ece_extremes_and_the_last_bin() -> None:
    assert m.ece([1.0, 1.0], [True, True]) == 0.0
    assert m.ece([1.0, 1.0], [False, False]) == 1.0
    # 0.5 opens the upper of two bins: alone there it is perfectly calibrated at accuracy 1/2
    assert m.ece([0.5, 0.5], [1, 0], bins=2) == 0.0


def test_reliability_bins() -> None:
    result = m.reliability([0.1, 0.2, 0.9, 1.0], [0, 1, 1, 1], bins=4)
    assert result.lower.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert result.upper.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert result.rows.tolist() == [2, 0, 0, 2]
    assert result.confidence[0] == pytest.approx((0.1 + 0.2) / 2)
    assert result.accuracy[0] == 0.5
    assert result.confidence[3] == pytest.approx((0.9 + 1.0) / 2)
    assert result.accuracy[3] == 1.0
    assert np.isnan(result.confidence[1:3]).all() and np.isnan(result.accuracy[1:3]).all()
    assert m.reliability([1.0], [1]).rows[-1] == 1  # 1.0 lands in the last of the default 15 bins


def test_brier_by_hand() -> None:
    probs = [[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]]
    # row 0 (true 0): .3^2 + .2^2 + .1^2 = .14; row 1 (true 2): .1^2 + .6^2 + .7^2 = .86
    assert m.brier(probs, [0, 2]) == pytest.approx((0.14 + 0.86) / 2)
    assert m.brier(probs, [0, 2], weight=[3, 1]) == pytest.approx((3 * 0.14 + 0.86) / 4)
    assert m.brier([[1.0, 0.0]], [0]) == 0.0
    assert m.brier([[0.0, 1.0]], [0]) == 2.0


def test_log_loss_by_hand() -> None:
    probs = [[0.7, 0.3], [0.3, 0.7]]
    assert m.log_loss(probs, [0, 0]) == pytest.approx(-(math.log(0.7) + math.log(0.3)) / 2)
    assert m.log_loss(probs, [0, 0], weight=[1, 3]) == pytest.approx(-(math.log(0.7) + 3 * math.log(0.3)) / 4)
    # a certain wrong answer costs -log(eps), not infinity
    assert m.log_loss([[0.0, 1.0]], [0]) == pytest.approx(-math.log(1e-12))
    assert m.log_loss([[0.0, 1.0]], [0], eps=1e-3) == pytest.approx(-math.log(1e-3))
    assert m.log_loss([[1.0, 0.0]], [0]) == 0.0


def test_probability_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="column indices"):
        m.brier([[0.5, 0.5]], ["a"])
    with pytest.raises(ValueError, match=r"lie in \[0, 2\)"):
        m.log_loss([[0.5, 0.5]], [2])
    with pytest.raises(ValueError, match="probs must be finite"):
        m.brier([[1.5, -0.5]], [0])
    with pytest.raises(ValueError, match="eps"):
        m.log_loss([[0.5, 0.5]], [0], eps=0.0)


# -- AUROC ---------------------------------------------------------------------------------------------


def test_auroc_by_hand() -> None:
    # positives .35 and .8 against negatives .1 and .4: .35 beats .1 only, .8 beats both -> 3 of 4
    assert m.auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert m.auroc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert m.auroc([0.9, 0.8, 0.1], [False, False, True]) == 0.0


def test_auroc_ties_count_one_half() -> None:
    # positive .5 ties negative .5 (1/2) and beats .2; positive .9 beats both -> (1/2 + 3) / 4
    assert m.auroc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1]) == (0.5 + 3) / 4
    assert m.auroc([0.3, 0.3, 0.3], [1, 0, 1]) == 0.5


def test_auroc_single_class_is_nan() -> None:
    assert math.isnan(m.auroc([0.1, 0.9], [1, 1]))
    assert math.isnan(m.auroc([0.1, 0.9], [False, False]))
    with pytest.raises(ValueError, match="boolean or 0/1"):
        m.auroc([0.1, 0.9], [0, 2])


@settings(deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.booleans()), min_size=2, max_size=60, unique_by=lambda r: r[0]))
def test_auroc_of_negated_scores_is_the_complement(rows: list[tuple[float, bool]]) -> None:
    scores = np.array([s for s, _ in rows])
    positives = np.array([p for _, p in rows])
    assume(positives.any() and not positives.all())
    assert m.auroc(scores, positives) + m.auroc(-scores, positives) == pytest.approx(1.0)


# -- selective prediction ------------------------------------------------------------------------------


def test_coverage_curve_keeps_ties_together() -> None:
    curve = m.coverage_curve([0.9, 0.8, 0.8, 0.6], [1, 1, 0, 1])
    # t = .9 keeps 1 row (right); t = .8 keeps 3 (2 right); t = .6 keeps all 4 (3 right)
    assert curve.threshold.tolist() == [0.9, 0.8, 0.6]
    assert curve.coverage.tolist() == [1 / 4, 3 / 4, 1.0]
    assert curve.accuracy.tolist() == pytest.approx([1.0, 2 / 3, 3 / 4])


def test_coverage_at_takes_the_largest_coverage() -> None:
    confidence, correct = [0.9, 0.8, 0.8, 0.6], [1, 1, 0, 1]
    # accuracy 1, 2/3, 3/4: at .7 the full set (3/4) qualifies although the middle point does not
    assert m.coverage_at(confidence, correct, 0.7) == m.SelectivePoint(1.0, 0.75, 0.6)
    assert m.coverage_at(confidence, correct, 0.8) == m.SelectivePoint(0.25, 1.0, 0.9)
    missed = m.coverage_at(confidence, correct, 1.01)
    assert (missed.coverage, missed.threshold) == (0.0, math.inf) and math.isnan(missed.accuracy)


def test_coverage_all_right_and_all_wrong() -> None:
    assert m.coverage_at([0.2, 0.9], [1, 1], 1.0) == m.SelectivePoint(1.0, 1.0, 0.2)
    assert m.coverage_at([0.2, 0.9], [0, 0], 0.5).coverage == 0.0


def test_kept_at_a_fixed_threshold() -> None:
    confidence, correct = [0.9, 0.8, 0.8, 0.6], [1, 1, 0, 1]
    assert m.kept_at(confidence, correct, 0.8) == m.SelectivePoint(3 / 4, 2 / 3, 0.8)
    nothing = m.kept_at(confidence, correct, 0.95)
    assert nothing.coverage == 0.0 and math.isnan(nothing.accuracy)
    # coverage_at's "unreachable" threshold keeps nothing, consistently
    assert m.kept_at(confidence, correct, math.inf).coverage == 0.0


@settings(deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=60))
def test_coverage_curve_ends_at_plain_accuracy(rows: list[tuple[float, bool]]) -> None:
    confidence = [c for c, _ in rows]
    correct = np.array([r for _, r in rows])
    curve = m.coverage_curve(confidence, correct)
    assert curve.coverage[-1] == 1.0
    assert curve.accuracy[-1] == pytest.approx(m.accuracy(correct, np.ones(len(correct), dtype=bool)))
    assert (np.diff(curve.threshold) < 0).all() and (np.diff(curve.coverage) > 0).all()


@settings(deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.booleans(), st.floats(0, 10)), min_size=1, max_size=60),
    st.integers(1, 30),
)
def test_ece_lies_in_unit_interval(rows: list[tuple[float, bool, float]], bins: int) -> None:
    weight = [w for _, _, w in rows]
    assume(sum(weight) > 0)
    value = m.ece([c for c, _, _ in rows], [r for _, r, _ in rows], bins=bins, weight=weight)
    assert 0.0 <= value <= 1.0 + 1e-12


# -- checks and latency ---------------------------------------------------------------------------------


def test_verdict_shares_by_hand() -> None:
    shares = m.verdict_shares(
        ["safe", "safe", "safe", "unsafe", "unsafe"], ["allow", "allow", "review", "deny", "review"]
    )
    assert shares == {
        "safe": m.VerdictShares(allowed=2 / 3, reviewed=1 / 3, denied=0.0, rows=3),
        "unsafe": m.VerdictShares(allowed=0.0, reviewed=0.5, denied=0.5, rows=2),
    }
    with pytest.raises(ValueError, match="unknown verdicts"):
        m.verdict_shares(["safe"], ["block"])


def test_verdicts_are_the_kernels() -> None:
    assert set(m._VERDICTS) == set(get_args(Verdict))


def test_percentiles_interpolate_linearly() -> None:
    values = list(range(1, 11))
    # position q/100 * (n - 1): 50 -> 4.5 (between 5 and 6); 99 -> 8.91 (between 9 and 10)
    assert m.percentiles(values) == pytest.approx({50: 5.5, 99: 9.91})
    assert m.percentiles([7.0], (0, 100)) == {0.0: 7.0, 100.0: 7.0}
    with pytest.raises(ValueError, match="within"):
        m.percentiles(values, (50, 101))


# -- RouteLLM --------------------------------------------------------------------------------------------

# Four prompts; descending score visits rows 0, 3, 2, 1, whose strong - weak correctness is 0, -1, +1, +1.
SCORE, WEAK, STRONG = [0.9, 0.1, 0.5, 0.7], [1, 0, 0, 1], [1, 1, 1, 0]


def test_gap_recovered_curve_by_hand() -> None:
    curve = m.gap_recovered_curve(SCORE, WEAK, STRONG)
    # weak mean 2/4, strong mean 3/4: the gap is 1/4
    assert curve.strong_share.tolist() == [0, 0.25, 0.5, 0.75, 1]
    assert curve.quality.tolist() == [0.5, 0.5, 0.25, 0.5, 0.75]
    assert curve.recovered.tolist() == pytest.approx([0, 0, -1, 0, 1])
    assert curve.threshold.tolist() == [math.inf, 0.9, 0.7, 0.5, 0.1]


def test_apgr_and_cpt_by_hand() -> None:
    # trapezoids of width 1/4 over recovered 0, 0, -1, 0, 1
    assert m.apgr(SCORE, WEAK, STRONG) == pytest.approx(0.25 * ((0 + 0) / 2 + (0 - 1) / 2 + (-1 + 0) / 2 + (0 + 1) / 2))
    # first reaches 1/2 between (3/4, 0) and (1, 1)
    assert m.cpt(SCORE, WEAK, STRONG, 0.5) == pytest.approx(0.75 + 0.5 * 0.25 / 1)
    assert m.cpt(SCORE, WEAK, STRONG, 0.0) == 0.0
    assert math.isnan(m.cpt(SCORE, WEAK, STRONG, 1.5))


def test_tied_scores_move_together() -> None:
    # scores 1, 1 then 0, 0; strong - weak is +1, 0 in the first pair and +1, -1 in the second
    curve = m.gap_recovered_curve([1, 1, 0, 0], [0, 1, 0, 1], [1, 1, 1, 0])
    assert curve.strong_share.tolist() == [0, 0.5, 1]
    assert curve.recovered.tolist() == pytest.approx([0, 1, 1])
    assert m.apgr([1, 1, 0, 0], [0, 1, 0, 1], [1, 1, 1, 0]) == pytest.approx(0.5 * (0 + 1) / 2 + 0.5 * 1)


def test_quantile_points_are_routellms() -> None:
    score, weak, strong = [1, 2, 3, 4], [1, 1, 0, 0], [0, 1, 1, 1]
    curve = m.gap_recovered_curve(score, weak, strong, quantiles=2)
    # pd.qcut(score, 2) edges 1, 2.5, 4: >= 1 routes all, >= 2.5 routes {3, 4}, and > 4 (last) none
    assert curve.strong_share.tolist() == [0, 0.5, 1]
    assert curve.quality.tolist() == [0.5, 1.0, 0.75]
    assert curve.threshold.tolist() == [math.inf, 2.5, 1.0]
    # weak 1/2, strong 3/4: recovered 0, 2, 1
    assert m.apgr(score, weak, strong, quantiles=2) == pytest.approx(0.5 * (0 + 2) / 2 + 0.5 * (2 + 1) / 2)


def _routellm_reference(
    score: NDArray[np.float64], weak: NDArray[np.bool_], strong: NDArray[np.bool_]
) -> tuple[float, list[float]]:
    """RouteLLM's arithmetic transcribed (benchmarks.py evaluate, evaluate.py generate_results), in percent."""
    thresholds = np.quantile(score, np.linspace(0, 1, 11))
    share, accuracy = [], []
    for i, t in enumerate(thresholds):
        selection = score >= t if i != len(thresholds) - 1 else score > t
        share.append(selection.mean() * 100)
        accuracy.append(np.where(selection, strong, weak).mean() * 100)
    order = np.argsort(share)
    x, y = np.array(share)[order], np.array(accuracy)[order]
    w, s = weak.mean() * 100, strong.mean() * 100
    auc = np.trapezoid(y, x / 100)
    weak_auc, strong_auc = np.trapezoid(np.full(len(x), w), x / 100), np.trapezoid(np.full(len(x), s), x / 100)
    cpts = [float(np.interp(p * (s - w) + w, y, x)) for p in (0.2, 0.5, 0.8)]
    return float((auc - weak_auc) / (strong_auc - weak_auc)), cpts


def _synthetic(n: int, seed: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    rng = np.random.default_rng(seed)
    return rng.random(n) < 0.6, rng.random(n) < 0.8


def test_quantile_mode_matches_routellm_arithmetic() -> None:
    weak, strong = _synthetic(3000, seed=3)
    # a router that knows something: rising curve, where np.interp is well defined
    score = (strong.astype(float) - weak) + np.random.default_rng(4).normal(0, 1, 3000)
    reference_apgr, reference_cpt = _routellm_reference(score, weak, strong)
    assert m.apgr(score, weak, strong, quantiles=10) == pytest.approx(reference_apgr, abs=1e-12)
    ours = [100 * m.cpt(score, weak, strong, p, quantiles=10) for p in (0.2, 0.5, 0.8)]
    assert ours == pytest.approx(reference_cpt, abs=1e-9)


def test_random_router_recovers_half_the_gap() -> None:
    weak, strong = _synthetic(20_000, seed=0)
    values = [m.apgr(np.random.default_rng(100 + seed).random(20_000), weak, strong) for seed in range(5)]
    assert np.mean(values) == pytest.approx(0.5, abs=0.02)
    assert m.cpt(np.random.default_rng(9).random(20_000), weak, strong, 0.5) == pytest.approx(0.5, abs=0.05)


def test_oracle_router_recovers_more_than_the_gap() -> None:
    weak, strong = _synthetic(20_000, seed=1)
    # strong - weak puts only-strong-right prompts first and only-weak-right prompts last
    oracle = strong.astype(float) - weak
    assert m.apgr(oracle, weak, strong) > 1.0
    assert m.apgr(oracle, weak, strong, quantiles=10) > 1.0
    # CPT(50%) of the oracle is half the gap: each strong call early on gains one right answer
    gap = strong.mean() - weak.mean()
    assert m.cpt(oracle, weak, strong, 0.5) == pytest.approx(0.5 * gap)


def test_cpt_is_monotone_in_the_target() -> None:
    weak, strong = _synthetic(2000, seed=2)
    score = (strong.astype(float) - weak) + np.random.default_rng(5).normal(0, 1.5, 2000)
    for quantiles in (None, 10):
        shares = [m.cpt(score, weak, strong, t, quantiles=quantiles) for t in np.linspace(0, 1, 41)]
        assert (np.diff(shares) >= 0).all()
        assert shares[0] == 0.0 and shares[-1] <= 1.0


def test_no_gap_is_an_error() -> None:
    with pytest.raises(ValueError, match="no gap"):
        m.apgr([0.1, 0.2], [1, 0], [0, 1])
    with pytest.raises(ValueError, match="quantiles"):
        m.apgr(SCORE, WEAK, STRONG, quantiles=0)


# -- paired bootstrap -----------------------------------------------------------------------------------


def test_paired_bootstrap_is_deterministic_and_centred() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.random(500) < 0.8, rng.random(500) < 0.7
    first = m.paired_bootstrap(a, b, seed=11)
    assert first == m.paired_bootstrap(a, b, seed=11)
    assert first != m.paired_bootstrap(a, b, seed=12)
    assert first.difference == pytest.approx(a.mean() - b.mean())
    assert first.low < first.difference < first.high
    assert (first.low + first.high) / 2 == pytest.approx(first.difference, abs=0.01)
    assert first.p_value < 0.01


def test_paired_bootstrap_of_equal_engines() -> None:
    a = np.array([1, 0, 1, 1, 0])
    result = m.paired_bootstrap(a, a, n=200)
    # identical rows: every resample differs by 0, and every one is "as extreme" as 0
    assert result == m.Bootstrap(difference=0.0, low=0.0, high=0.0, p_value=1.0)


def test_paired_bootstrap_other_statistic() -> None:
    a, b = [1.0, 2.0, 3.0, 10.0], [1.0, 1.0, 1.0, 1.0]
    result = m.paired_bootstrap(a, b, statistic=np.median, n=100)
    assert result.difference == (2.0 + 3.0) / 2 - 1.0
    with pytest.raises(ValueError, match="level"):
        m.paired_bootstrap(a, b, level=1.0)


# -- input checks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: m.accuracy([], []),
        lambda: m.macro_f1([], []),
        lambda: m.confusion([], []),
        lambda: m.ece([], []),
        lambda: m.reliability([], []),
        lambda: m.brier(np.empty((0, 2)), []),
        lambda: m.log_loss(np.empty((0, 2)), []),
        lambda: m.auroc([], []),
        lambda: m.coverage_curve([], []),
        lambda: m.coverage_at([], [], 0.9),
        lambda: m.kept_at([], [], 0.5),
        lambda: m.verdict_shares([], []),
        lambda: m.percentiles([]),
        lambda: m.gap_recovered_curve([], [], []),
        lambda: m.apgr([], [], []),
        lambda: m.cpt([], [], [], 0.5),
        lambda: m.paired_bootstrap([], []),
    ],
)
def test_empty_input_is_an_error(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError, match="empty"):
        call()


def test_mismatched_and_invalid_input_is_an_error() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        m.accuracy([1, 2], [1])
    with pytest.raises(ValueError, match="different lengths"):
        m.apgr([0.1, 0.2], [1, 0], [1])
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        m.ece([1.2], [1])
    with pytest.raises(ValueError, match="NaN"):
        m.auroc([math.nan, 0.1], [0, 1])
    with pytest.raises(ValueError, match="non-negative"):
        m.accuracy([1, 2], [1, 2], weight=[1, -1])
    with pytest.raises(ValueError, match="weight has 1 rows"):
        m.brier([[1.0, 0.0], [0.0, 1.0]], [0, 1], weight=[1])
    with pytest.raises(ValueError, match="bins"):
        m.ece([0.5], [1], bins=0)
