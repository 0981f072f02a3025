"""The statistics core against values computed by hand (closed forms and
published t-table values), no scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detaudit.stats.numerics import (
    bootstrap_interval,
    json_safe,
    mean,
    mean_difference_interval,
    paired_t_test,
    pairwise_disagreement,
    pearson_correlation,
    relative_l2_distance,
    sample_std,
    std_ratio_interval,
    t_two_sided_p,
    welch_t_test,
)

ISSUE_A = [90.5, 89.8, 90.4, 89.9, 90.2]
ISSUE_B = [90.0, 90.3, 90.1, 90.5, 90.0]


def test_mean_and_sample_std_by_hand():
    values = [2, 4, 4, 4, 5, 5, 7, 9]
    assert mean(values) == 5
    assert sample_std(values) == pytest.approx(math.sqrt(32 / 7), rel=1e-15)


@pytest.mark.parametrize("value", [0.1, 78.90625, 1.0785216093063354, -3e-8])
def test_identical_values_have_exactly_zero_spread(value):
    assert sample_std([value] * 7) == 0.0
    assert mean([value] * 3) == value


def test_std_needs_two_values():
    assert math.isnan(sample_std([1.0]))


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 4.5, 40.0])
def test_t_p_value_closed_forms(t):
    # df=1 is the Cauchy distribution, df=2 and df=4 have closed-form CDFs
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)
    assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)
    u = t / math.sqrt(1 + t * t / 4)
    cdf4 = 0.5 + 3 / 8 * u * (1 - t * t / (12 * (1 + t * t / 4)))
    assert t_two_sided_p(t, 4) == pytest.approx(2 * (1 - cdf4), abs=1e-12)


@pytest.mark.parametrize("t, df", [(12.7062, 1), (2.776445, 4), (2.570582, 5), (2.228139, 10), (1.983972, 100)])
def test_t_table_critical_values_give_five_percent(t, df):
    assert t_two_sided_p(t, df) == pytest.approx(0.05, abs=1e-6)


def test_paired_t_on_the_issue_example():
    # differences B - A: -0.5, 0.5, -0.3, 0.6, -0.2 -> mean 0.02, sd sqrt(0.988 / 4)
    result = paired_t_test(ISSUE_A, ISSUE_B)
    sd = math.sqrt(0.988 / 4)
    assert result.df == 4
    assert result.statistic == pytest.approx(0.02 / (sd / math.sqrt(5)), rel=1e-9)
    assert 0.9 < result.p_value < 0.95


def test_welch_by_hand():
    # means 2 and 6, variances 1 and 4: se^2 = 1/3 + 4/3, df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 50/17
    result = welch_t_test([1, 2, 3], [4, 6, 8])
    assert result.statistic == pytest.approx(4 / math.sqrt(5 / 3))
    assert result.df == pytest.approx(50 / 17)
    assert 0.02 < result.p_value < 0.1


def test_bootstrap_is_reproducible_and_exact_on_constants():
    first = mean_difference_interval(ISSUE_A, ISSUE_B, paired=True)
    assert first == mean_difference_interval(ISSUE_A, ISSUE_B, paired=True)
    assert first.covers(0.0)
    assert -0.5 <= first.low < 0.02 < first.high <= 0.6  # inside the range of the differences
    constant = bootstrap_interval([[3.5] * 6], lambda rows: rows.mean(axis=1))
    assert (constant.low, constant.high) == (3.5, 3.5)


def test_bootstrap_separates_a_real_shift():
    a = [1.0, 1.1, 0.9, 1.05, 0.95]
    interval = mean_difference_interval(a, [x + 2 for x in a], paired=True)
    assert (interval.low, interval.high) == pytest.approx((2.0, 2.0))
    unpaired = mean_difference_interval(a, [x + 2 for x in a], paired=False)
    assert 1.8 < unpaired.low < 2.0 < unpaired.high < 2.2


def test_std_ratio_interval():
    zero = std_ratio_interval([4.0] * 5, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert (zero.low, zero.high) == (0.0, 0.0)
    same = std_ratio_interval([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    assert same.low < 1.0 < same.high


def test_pairwise_disagreement_by_hand():
    labels = [np.array([0, 1, 2, 0]), np.array([0, 1, 1, 0]), np.array([1, 1, 2, 0])]
    # pairs: (1,2) 1/4, (1,3) 1/4, (2,3) 2/4
    assert pairwise_disagreement(labels) == pytest.approx(1 / 3)
    logits = [np.eye(3)[label] * 5.0 for label in labels]  # argmax recovers the labels
    assert pairwise_disagreement(logits) == pytest.approx(1 / 3)


def test_pearson_by_hand():
    # centred x = (-1, 0, 1), centred y = (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114/9)
    assert pearson_correlation([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert pearson_correlation([[1.0, 2.0]], [[1.0, 2.0]]) == 1.0


def test_relative_l2_distance():
    assert relative_l2_distance({"w": np.array([3.0, 4.0])}, {"w": np.array([3.0, 5.0])}) == pytest.approx(0.2)
    same = {"w": np.array([3.0, 4.0]), "b": np.array([1.0])}
    assert relative_l2_distance(same, dict(same)) == 0.0
    with pytest.raises(ValueError):
        relative_l2_distance(same, {"w": np.array([3.0, 4.0])})


def test_json_safe_replaces_nan_and_inf():
    assert json_safe({"a": [math.nan, 1.0], "b": math.inf, "c": "x"}) == {"a": [None, 1.0], "b": None, "c": "x"}
