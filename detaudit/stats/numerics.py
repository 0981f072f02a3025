"""The statistics the reproducibility commands share.

Tests and the bootstrap come from scipy (the ``stats`` extra); numpy and
scipy are imported inside the functions that need them.  Means and standard
deviations are pure Python on purpose: identical values must give a
standard deviation of exactly 0.0 (the "deterministic mode collapses the
fixed arm" proof), so they are computed on values shifted by the first
sample, where identical samples give exact zeros.  Degenerate data (no
spread at all) gets exact answers here instead of scipy's nan and warnings.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

#: what to install when scipy is missing (the commands say it in one line)
STATS_EXTRA = 'pip install "detaudit[stats]"'
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # a fixed RNG: the same data always gives the same interval
CONFIDENCE = 0.95


def scipy_missing(command: str) -> str | None:
    """The one-line error for ``detaudit COMMAND`` when scipy is not installed, else None."""
    try:
        import scipy.stats  # noqa: F401
    except ImportError:
        return f"detaudit {command} computes its statistics with scipy, which is not installed: {STATS_EXTRA}"
    return None


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


@dataclass(frozen=True)
class TestResult:
    name: str  # "paired t-test" or "Welch's t-test"
    statistic: float
    df: float
    p_value: float


def _no_spread_result(name: str, center: float, df: float) -> TestResult:
    """Every value identical: scipy returns nan (0/0); the answer is exact
    instead: no difference at all (t = 0, p = 1) or one without any noise
    (t = ±inf, p = 0)."""
    if center == 0.0:
        return TestResult(name, 0.0, df, 1.0)
    return TestResult(name, math.copysign(math.inf, center), df, 0.0)


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> TestResult:
    """Tests whether the mean of ``b - a`` over matched seeds is zero
    (``scipy.stats.ttest_rel``, two-sided)."""
    from scipy import stats

    name = "paired t-test"
    differences = [y - x for x, y in zip(a, b)]
    n = len(differences)
    if n < 2:
        return TestResult(name, math.nan, n - 1, math.nan)
    if sample_std(differences) == 0.0:
        return _no_spread_result(name, mean(differences), n - 1)
    result = stats.ttest_rel(list(b), list(a))
    return TestResult(name, float(result.statistic), float(result.df), float(result.pvalue))


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> TestResult:
    """Tests whether mean(b) - mean(a) is zero without assuming equal
    variances (``scipy.stats.ttest_ind(equal_var=False)``, two-sided)."""
    from scipy import stats

    name = "Welch's t-test"
    if len(a) < 2 or len(b) < 2:
        return TestResult(name, math.nan, math.nan, math.nan)
    if sample_std(a) == 0.0 and sample_std(b) == 0.0:
        return _no_spread_result(name, mean(b) - mean(a), len(a) + len(b) - 2)
    result = stats.ttest_ind(list(b), list(a), equal_var=False)
    return TestResult(name, float(result.statistic), float(result.df), float(result.pvalue))


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

    def to_list(self) -> list[float]:
        return [self.low, self.high]


def bootstrap_interval(
    samples: Sequence[Sequence[float]],
    statistic: Callable,
    *,
    paired: bool = False,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = BOOTSTRAP_SEED,
) -> Interval:
    """Percentile bootstrap interval of ``statistic(*samples)`` (``scipy.stats.bootstrap``).

    ``statistic`` receives one array per sample and reduces its last axis
    (scipy hands it batches of resamples, shape ``(..., n)``).  ``paired``
    resamples the same indices in every sample (matched seeds); otherwise
    each sample is resampled on its own, which makes a stratified bootstrap
    when the samples are strata (Agarwal et al. 2021).

    Degenerate data is handled here, not left to scipy (which warns and
    returns nan): samples that are all constant give the exact interval
    [statistic, statistic]; a sample of one value is held fixed (it has
    nothing to resample); resamples on which the statistic is undefined (a
    0/0 ratio when a resample repeats one value) are left out of the interval.
    """
    import numpy as np
    from scipy import stats

    arrays = [np.asarray(sample, dtype=float) for sample in samples]
    if any(array.size == 0 for array in arrays):
        return Interval(math.nan, math.nan, confidence)
    if all(np.all(array == array[0]) for array in arrays):
        with np.errstate(divide="ignore", invalid="ignore"):
            value = float(statistic(*arrays))
        return Interval(value, value, confidence)
    moving = [array for array in arrays if array.size >= 2]
    if paired and len(moving) != len(arrays):
        return Interval(math.nan, math.nan, confidence)

    def on_resamples(*resampled, axis=-1):
        replacements = iter(resampled)
        return statistic(*(next(replacements) if array.size >= 2 else array for array in arrays))

    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")  # degenerate resamples: handled below
        result = stats.bootstrap(
            moving,
            on_resamples,
            paired=paired,
            vectorized=True,
            n_resamples=resamples,
            confidence_level=confidence,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
        low, high = (float(bound) for bound in result.confidence_interval)
        if math.isnan(low) or math.isnan(high):
            tail = (1.0 - confidence) / 2.0
            low, high = (
                float(bound)
                for bound in stats.quantile(
                    result.bootstrap_distribution, np.array([tail, 1.0 - tail]), nan_policy="omit"
                )
            )
    return Interval(low, high, confidence)


def row_std(rows):
    """Sample std (n - 1) along the last axis, on values shifted by the first
    one so that identical values give exactly 0.0 (numpy's own mean of
    identical floats can be off by one ULP, leaving a std of 1e-17)."""
    return (rows - rows[..., :1]).std(axis=-1, ddof=1)


def std_ratio_interval(fixed: Sequence[float], varied: Sequence[float]) -> Interval:
    """Bootstrap interval of std(fixed) / std(varied), arms resampled independently."""
    return bootstrap_interval([fixed, varied], lambda f, v: row_std(f) / row_std(v))


def mean_difference_interval(a: Sequence[float], b: Sequence[float], *, paired: bool) -> Interval:
    """Bootstrap interval of mean(b) - mean(a) (of the per-seed differences when paired)."""
    return bootstrap_interval([a, b], lambda x, y: y.mean(axis=-1) - x.mean(axis=-1), paired=paired)


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
