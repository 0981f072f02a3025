"""The few statistics the reproducibility commands need.

scipy is not a dependency, so Student's t distribution is computed here from
the regularized incomplete beta function.  Means and standard deviations are
pure Python on purpose: identical values must give a standard deviation of
exactly 0.0 (the "deterministic mode collapses the fixed arm" proof), so they
are computed on values shifted by the first sample, where identical samples
give exact zeros.  numpy is imported inside the functions that resample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # a fixed RNG: the same data always gives the same interval
CONFIDENCE = 0.95


def mean(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    first = values[0]
    return first + math.fsum(v - first for v in values) / len(values)


def sample_std(values: Sequence[float]) -> float:
    """Standard deviation with Bessel's correction (n - 1); nan below two values."""
    if len(values) < 2:
        return math.nan
    first = values[0]
    shifted = [v - first for v in values]
    shifted_mean = math.fsum(shifted) / len(shifted)
    return math.sqrt(math.fsum((d - shifted_mean) ** 2 for d in shifted) / (len(values) - 1))



@dataclass
class Sample:
    """One metric's values over runs (one arm of a study, one model's seeds)."""

    values: list[float]

    @property
    def runs(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return mean(self.values)

    @property
    def std(self) -> float:
        return sample_std(self.values)

    @property
    def collapsed(self) -> bool:
        """Every run gave the bitwise-same value."""
        return len(self.values) >= 2 and len(set(self.values)) == 1


def _continued_fraction_beta(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # the continued fraction converges fast only below the mean a / (a + b)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction_beta(a, b, x) / a
    return 1.0 - math.exp(log_front) * _continued_fraction_beta(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom."""
    if math.isnan(t) or df <= 0:
        return math.nan
    if math.isinf(t):
        return 0.0
    return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True)
class TestResult:
    name: str  # "paired t-test" or "Welch's t-test"
    statistic: float
    df: float
    p_value: float


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> TestResult:
    """Tests whether the mean of ``b - a`` over matched seeds is zero."""
    differences = [y - x for x, y in zip(a, b)]
    n = len(differences)
    spread = sample_std(differences)
    if n < 2:
        return TestResult("paired t-test", math.nan, n - 1, math.nan)
    center = mean(differences)
    if spread == 0.0:
        statistic = 0.0 if center == 0.0 else math.copysign(math.inf, center)
    else:
        statistic = center / (spread / math.sqrt(n))
    return TestResult("paired t-test", statistic, n - 1, t_two_sided_p(statistic, n - 1))


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> TestResult:
    """Tests whether mean(b) - mean(a) is zero without assuming equal variances."""
    if len(a) < 2 or len(b) < 2:
        return TestResult("Welch's t-test", math.nan, math.nan, math.nan)
    var_a = sample_std(a) ** 2 / len(a)
    var_b = sample_std(b) ** 2 / len(b)
    center = mean(b) - mean(a)
    if var_a + var_b == 0.0:
        statistic = 0.0 if center == 0.0 else math.copysign(math.inf, center)
        return TestResult("Welch's t-test", statistic, len(a) + len(b) - 2, 0.0 if center else 1.0)
    statistic = center / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    return TestResult("Welch's t-test", statistic, df, t_two_sided_p(statistic, df))


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float = CONFIDENCE

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


def bootstrap_interval(
    samples: Sequence[Sequence[float]],
    statistic: Callable,
    *,
    paired: bool = False,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """Percentile bootstrap interval of ``statistic(*resampled_samples)``.

    ``statistic`` receives one 2-D array per sample (resamples x n) and returns
    one value per row.  ``paired`` resamples the same indices in every sample
    (matched seeds); otherwise each sample is resampled on its own.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = [np.asarray(sample, dtype=float) for sample in samples]
    if paired:
        indices = rng.integers(0, len(arrays[0]), size=(resamples, len(arrays[0])))
        resampled = [array[indices] for array in arrays]
    else:
        resampled = [array[rng.integers(0, len(array), size=(resamples, len(array)))] for array in arrays]
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.asarray(statistic(*resampled), dtype=float)
    values = values[~np.isnan(values)]  # 0/0 ratios from degenerate resamples
    if values.size == 0:
        return Interval(math.nan, math.nan, confidence)
    tail = (1.0 - confidence) / 2.0
    # no interpolation: a resampled ratio can be infinite and inf - inf is nan
    low, high = np.quantile(values, [tail, 1.0 - tail], method="inverted_cdf")
    return Interval(float(low), float(high), confidence)


def resampled_std(rows):
    """Row-wise sample std of a (resamples x n) array (shift-free; n >= 2)."""
    return rows.std(axis=1, ddof=1)


def std_ratio_interval(fixed: Sequence[float], varied: Sequence[float]) -> Interval:
    """Bootstrap interval of std(fixed) / std(varied), arms resampled independently."""
    return bootstrap_interval(
        [fixed, varied], lambda f, v: resampled_std(f) / resampled_std(v)
    )


def mean_difference_interval(a: Sequence[float], b: Sequence[float], *, paired: bool) -> Interval:
    """Bootstrap interval of mean(b) - mean(a) (of the per-seed differences when paired)."""
    return bootstrap_interval([a, b], lambda x, y: y.mean(axis=1) - x.mean(axis=1), paired=paired)


def pairwise_disagreement(predictions: Sequence) -> float:
    """Average, over all pairs of runs, of the fraction of examples whose
    predicted class differs.  Each entry is one run's logits (n x classes,
    the class is the argmax) or its predicted labels (n,)."""
    import numpy as np

    labels = [_predicted_labels(np.asarray(p)) for p in predictions]
    fractions = [
        float(np.mean(labels[i] != labels[j]))
        for i in range(len(labels))
        for j in range(i + 1, len(labels))
    ]
    return mean(fractions) if fractions else math.nan


def _predicted_labels(array):
    return array.argmax(axis=-1) if array.ndim >= 2 else array


def pearson_correlation(first, second) -> float:
    """Pearson correlation of two runs' flattened predictions (1.0 when identical)."""
    import numpy as np

    x = np.asarray(first, dtype=float).ravel()
    y = np.asarray(second, dtype=float).ravel()
    if np.array_equal(x, y):
        return 1.0
    x = x - x.mean()
    y = y - y.mean()
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator else math.nan


def relative_l2_distance(reference: dict, other: dict) -> float:
    """||other - reference|| / ||reference|| over all parameters of two state dicts
    (name -> array); exactly 0.0 when every parameter is bitwise identical."""
    import numpy as np

    if reference.keys() != other.keys():
        raise ValueError("the two runs saved different parameter names")
    squared_difference = 0.0
    squared_norm = 0.0
    for name, value in reference.items():
        ref = np.asarray(value, dtype=np.float64)
        diff = np.asarray(other[name], dtype=np.float64) - ref
        squared_difference += float(np.sum(diff * diff))
        squared_norm += float(np.sum(ref * ref))
    if squared_difference == 0.0:
        return 0.0
    return math.sqrt(squared_difference / squared_norm) if squared_norm else math.inf


def json_safe(data):
    """JSON has no nan/inf: they become null (recursively through dicts and lists)."""
    if isinstance(data, float):
        return None if math.isnan(data) or math.isinf(data) else data
    if isinstance(data, dict):
        return {key: json_safe(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(value) for value in data]
    return data
