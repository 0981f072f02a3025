"""The statistics core against values computed by hand (closed forms and
published t-table values): scipy computes them, these tests check that it is
asked the right question, and that degenerate data gets exact answers."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

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


def paired_data_with_t(t: float, df: int) -> tuple[list[float], list[float]]:
    """A and B over df + 1 seeds whose paired t statistic is ``t``: the
    differences are -k..k (sd sqrt(k(k+1)/3)) shifted by t * sd / sqrt(n)."""
    k, n = df // 2, df + 1
    if df % 2:  # an even number of seeds: -k-0.5 .. k+0.5
        offsets = [i + 0.5 for i in range(-k - 1, k + 1)]
    else:
        offsets = [float(i) for i in range(-k, k + 1)]
    shift = t * sample_std(offsets) / math.sqrt(n)
    a = [10.0 + i for i in range(n)]
    return a, [x + d + shift for x, d in zip(a, offsets)]


@pytest.mark.parametrize("t", [0.3, 1.0, 4.5, 40.0])
def test_paired_t_p_value_closed_forms(t):
    # df=1 is the Cauchy distribution, df=2 and df=4 have closed-form CDFs
    def two_sided(df):
        result = paired_t_test(*paired_data_with_t(t, df))
        assert result.df == df and result.statistic == pytest.approx(t, rel=1e-9)
        return result.p_value

    assert two_sided(1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-9)
    assert two_sided(2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-9)
    u = t / math.sqrt(1 + t * t / 4)
    cdf4 = 0.5 + 3 / 8 * u * (1 - t * t / (12 * (1 + t * t / 4)))
    assert two_sided(4) == pytest.approx(2 * (1 - cdf4), abs=1e-9)


@pytest.mark.parametrize("t, df", [(12.7062, 1), (2.776445, 4), (2.570582, 5), (2.228139, 10), (1.983972, 100)])
def test_t_table_critical_values_give_five_percent(t, df):
    assert paired_t_test(*paired_data_with_t(t, df)).p_value == pytest.approx(0.05, abs=1e-6)


def test_no_spread_gets_exact_answers_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = paired_t_test([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
        assert (same.statistic, same.p_value) == (0.0, 1.0)
        shifted = paired_t_test([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
        assert (shifted.statistic, shifted.p_value) == (math.inf, 0.0)
        constant = welch_t_test([0.1] * 4, [0.2] * 3)
        assert (constant.statistic, constant.p_value) == (math.inf, 0.0)
        assert std_ratio_interval([0.1] * 5, [1.0, 2.0, 3.0, 4.0, 5.0]).to_list() == [0.0, 0.0]
        assert mean_difference_interval([0.1] * 5, [0.1] * 5, paired=True).to_list() == [0.0, 0.0]


def test_without_scipy_the_commands_name_the_extra(tmp_path):
    """scipy hidden from a fresh interpreter: one line, exit 2, nothing run."""
    a = Path(__file__).resolve().parents[1] / "fixtures" / "stats" / "model_a.csv"
    hide_scipy = "import sys; sys.modules['scipy'] = None; from detaudit.cli import main; sys.exit(main(sys.argv[1:]))"
    for command in (["compare", str(a), str(a)], ["variance", str(a), "--out", str(tmp_path / "study")]):
        result = subprocess.run([sys.executable, "-c", hide_scipy, *command], capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        assert result.stderr.strip().splitlines() == [
            f"detaudit: error: detaudit {command[0]} computes its statistics with scipy, which is not installed: "
            'pip install "detaudit[stats]"'
        ]
    assert not (tmp_path / "study").exists()


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
    constant = bootstrap_interval([[3.5] * 6], lambda rows: rows.mean(axis=-1))
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
