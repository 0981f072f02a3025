"""How many seeds a difference needs: the power of the t-tests ``compare`` runs.

The power of a two-sided t-test at level ``ALPHA`` against a true difference
``delta`` comes from the noncentral t distribution (``scipy.stats.nct``):

* paired (the same seeds for both models): one-sample t-test on the per-seed
  differences, df = n - 1, noncentrality delta / (sd_d / sqrt(n));
* unpaired (n seeds per model): Welch's t-test, noncentrality
  delta / sqrt((sd_a^2 + sd_b^2) / n), Welch-Satterthwaite df.

The spreads are the measured ones and ``delta`` the observed difference, so
the answer reads "if the difference is what these seeds show": with few
seeds both are rough, which is why it is a recommendation, not a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALPHA = 0.05
POWER = 0.80
MAX_SEEDS = 100_000
MIN_SEEDS = 2


def t_test_power(delta: float, spread_a: float, spread_b: float | None, seeds: int, *, alpha: float = ALPHA) -> float:
    """Power of the two-sided t-test with ``seeds`` seeds (per model when
    unpaired).  ``spread_b`` None: paired, ``spread_a`` is the sd of the
    per-seed differences; else the two models' sds (Welch)."""
    from scipy import stats

    if spread_b is None:
        variance, df = spread_a**2, seeds - 1
    else:
        variance = spread_a**2 + spread_b**2
        fourth = spread_a**4 + spread_b**4
        df = variance**2 * (seeds - 1) / fourth if fourth else 2 * seeds - 2
    if variance == 0.0:
        return 1.0 if delta else alpha
    noncentrality = delta / math.sqrt(variance / seeds)
    critical = stats.t.ppf(1.0 - alpha / 2.0, df)
    power = float(stats.nct.sf(critical, df, noncentrality) + stats.nct.cdf(-critical, df, noncentrality))
    if math.isnan(power):  # scipy's nct gives up far in the tail (noncentrality ~ 15+): power is ~1 there
        power = float(stats.norm.sf(critical - noncentrality) + stats.norm.cdf(-critical - noncentrality))
    return power


def seeds_for_power(
    delta: float, spread_a: float, spread_b: float | None, *, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """The fewest seeds (per model when unpaired) whose t-test has ``power``
    against ``delta``; None when no number up to MAX_SEEDS does (or delta is 0)."""
    if delta == 0.0 or any(math.isnan(s) for s in (spread_a, spread_b or 0.0)):
        return None
    if t_test_power(delta, spread_a, spread_b, MAX_SEEDS, alpha=alpha) < power:
        return None
    low, high = MIN_SEEDS, MAX_SEEDS  # power grows with the seeds: bisect
    while low < high:
        middle = (low + high) // 2
        if t_test_power(delta, spread_a, spread_b, middle, alpha=alpha) >= power:
            high = middle
        else:
            low = middle + 1
    return low


def detectable_difference(spread: float, seeds: int, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest difference between two models, each run with ``seeds``
    seeds at this seed-to-seed sd, that Welch's t-test finds with ``power``."""
    from scipy import optimize

    if seeds < MIN_SEEDS or math.isnan(spread):
        return math.nan
    if spread == 0.0:
        return 0.0

    def shortfall(delta: float) -> float:
        return t_test_power(delta, spread, spread, seeds, alpha=alpha) - power

    high = spread
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high, xtol=spread * 1e-6))


def _round_up(seeds: int) -> int:
    """Two significant digits, rounded up (4,849 -> 4,900): the estimate is not more precise."""
    if seeds < 100:
        return seeds
    step = 10 ** (len(str(seeds)) - 2)
    return -(-seeds // step) * step


@dataclass(frozen=True)
class SeedsNeeded:
    """The recommendation ``compare`` prints for one metric."""

    difference: float
    spread: float  # sd of the per-seed differences (paired) or the larger model's sd (unpaired)
    paired: bool
    seeds_now: int
    seeds: int | None
    alpha: float = ALPHA
    power: float = POWER

    @property
    def test(self) -> str:
        return "paired t-test" if self.paired else "Welch's t-test"

    def in_words(self) -> str:
        unit = "seeds" if self.paired else "seeds per model"
        spread = "sd of the per-seed differences" if self.paired else "seed-to-seed sd"
        how = f"{spread} {self.spread:.3g}; {self.test}, two-sided, α = {self.alpha:g}, {self.power:.0%} power"
        if self.difference == 0.0:
            return f"no difference was observed, so no number of seeds makes one distinguishable ({how})"
        size = f"a difference of {abs(self.difference):.3g}"
        if self.seeds is None:
            return f"more than {MAX_SEEDS:,} {unit} would be needed to tell {size} from seed noise ({how})"
        if self.seeds <= self.seeds_now:
            return f"{self.seeds} {unit} suffice to tell {size} from seed noise ({how}); {self.seeds_now} were run"
        return (
            f"about {_round_up(self.seeds):,} {unit} would make {size} distinguishable from seed noise ({how}); "
            f"{self.seeds_now} were run"
        )

    def to_dict(self) -> dict:
        return {
            "seeds": self.seeds,
            "seeds_run": self.seeds_now,
            "per_model": not self.paired,
            "test": self.test,
            "alpha": self.alpha,
            "power": self.power,
            "difference": self.difference,
            "spread": self.spread,
            "in_words": self.in_words(),
        }
