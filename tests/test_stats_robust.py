"""Interquartile mean, stratified bootstrap, probability of improvement and
the seeds-needed power calculation, against values worked out by hand and
published sample sizes."""

from __future__ import annotations

import math

import pytest

from detaudit.stats.numerics import bootstrap_interval
from detaudit.stats.power import SeedsNeeded, detectable_difference, seeds_for_power, t_test_power
from detaudit.stats.robust import (
    interquartile_mean,
    interquartile_mean_interval,
    probability_of_improvement,
    probability_of_improvement_interval,
)


def test_iqm_is_the_mean_of_the_middle_half():
    # 8 runs: the two lowest and the two highest are cut, one outlier seed changes nothing
    assert interquartile_mean([[1, 2, 3, 4, 100, 5, 6, 7]]) == 4.5
    assert interquartile_mean([[1, 2, 3], [4, 100, 5, 6, 7]]) == 4.5  # strata are pooled


def test_stratified_bootstrap_keeps_every_task_in_every_resample():
    # Two tasks of 4 seeds on far-apart scales.  Pooled, the IQM is the middle of
    # the 8 values: the top two of task 1 and the bottom two of task 2.  A
    # stratified resample always has 4 of each, so the IQM stays near 5; an
    # unstratified one can draw 6 seeds of one task and lands near 0 or 10.
    task_1, task_2 = [0.0, 0.1, 0.2, 0.3], [10.0, 10.1, 10.2, 10.3]
    stratified = interquartile_mean_interval([task_1, task_2])
    assert 5.0 <= stratified.low < interquartile_mean([task_1, task_2]) < stratified.high <= 5.3
    pooled = interquartile_mean_interval([task_1 + task_2])
    assert pooled.low < 1.0 and pooled.high > 9.0


def test_probability_of_improvement_by_hand():
    # 9 pairs: B wins 6, ties 2 (counted half), loses 1 -> 7/9
    assert probability_of_improvement([[1, 2, 3]], [[2, 3, 4]]) == pytest.approx(7 / 9)
    assert probability_of_improvement([[1, 2, 3]], [[2, 3, 4]], lower_is_better=True) == pytest.approx(2 / 9)
    # averaged over tasks, not over pooled pairs: task 2 has 4x the seeds but counts once
    two_tasks = probability_of_improvement([[1, 2, 3], [5, 5, 5, 5]], [[2, 3, 4], [0, 0, 0, 0]])
    assert two_tasks == pytest.approx((7 / 9 + 0.0) / 2)
    always = probability_of_improvement_interval([[1.0, 1.1, 0.9]], [[5.0, 5.2, 4.9]])
    assert always.to_list() == [1.0, 1.0]
    coin = probability_of_improvement_interval([[1.0, 2.0, 3.0, 4.0]], [[1.5, 2.5, 3.5, 4.5]])
    assert coin.low < 0.5 < coin.high


def test_a_one_seed_stratum_is_held_fixed():
    interval = bootstrap_interval([[1.0, 2.0, 3.0], [10.0]], lambda a, b: a.mean(axis=-1) + b.mean(axis=-1))
    assert 11.0 <= interval.low < 12.0 < interval.high <= 13.0


@pytest.mark.parametrize(
    "effect, paired, published",
    [(0.5, True, 34), (0.8, True, 15), (0.5, False, 64), (0.8, False, 26)],
)
def test_seeds_for_power_matches_published_sample_sizes(effect, paired, published):
    # Cohen's d = 0.5 / 0.8 at alpha 0.05 two-sided and 80% power: one-sample/paired
    # t-test 34 / 15, two-sample t-test 64 / 26 per group (Cohen 1988; G*Power)
    spread_b = None if paired else 1.0
    assert seeds_for_power(effect, 1.0, spread_b) == published


def test_power_edge_cases():
    assert seeds_for_power(0.0, 1.0, None) is None  # nothing to detect
    assert seeds_for_power(1e-6, 1.0, None) is None  # beyond any budget
    assert seeds_for_power(1.0, 0.0, None) == 2  # no noise: the fewest seeds a test accepts
    assert t_test_power(1.0, 0.3, 0.25, 500) == pytest.approx(1.0)  # far tail: no nan
    smallest = detectable_difference(3.6, 4)
    assert t_test_power(smallest, 3.6, 3.6, 4) == pytest.approx(0.8, abs=1e-6)
    assert math.isnan(detectable_difference(math.nan, 4)) and detectable_difference(0.0, 4) == 0.0


def test_seeds_needed_in_words():
    many = SeedsNeeded(0.02, 0.497, True, 5, 4849)
    assert many.in_words().startswith("about 4,900 seeds would make a difference of 0.02 distinguishable")
    assert "paired t-test, two-sided, α = 0.05, 80% power" in many.in_words()
    enough = SeedsNeeded(1.0, 0.3, False, 5, 3)
    assert enough.in_words().startswith("3 seeds per model suffice") and "5 were run" in enough.in_words()
    assert "more than 100,000" in SeedsNeeded(1e-9, 1.0, True, 5, None).in_words()
