"""Does B really beat A, or is the difference seed noise?

Input: per-seed results of two models, each a CSV with a ``seed`` column and
one column per metric, or a ``detaudit variance --out`` folder (its varied-seed
arm).  On the seeds both share, the per-seed differences are compared (paired
bootstrap interval and paired t-test); with fewer than two common seeds, the
two groups are compared as they are (unpaired bootstrap and Welch's t-test).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from detaudit.stats.numerics import (
    Interval,
    Sample,
    TestResult,
    mean,
    mean_difference_interval,
    paired_t_test,
    welch_t_test,
)
from detaudit.stats.study import VARIED, Study, StudyError

SIGNIFICANCE = 0.05
# columns of a `variance` runs.csv that are not metrics
_NOT_METRICS = {"seed", "arm", "run", "status", "seconds"}

PerSeed = dict[str, dict[str, float]]  # metric -> seed -> value


def load_per_seed(path: Path) -> PerSeed:
    """Per-seed metric values from a CSV file or a variance study folder."""
    if path.is_dir():
        return _from_study(Study.load(path))
    if not path.is_file():
        raise StudyError(f"no such file or folder: {path}")
    with open(path, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    if not rows or "seed" not in rows[0]:
        raise StudyError(f"{path}: expected a CSV with a 'seed' column and one column per metric")
    if "arm" in rows[0]:  # a variance runs.csv: only the varied-seed runs are per-seed results
        rows = [row for row in rows if row["arm"] == VARIED and row.get("status", "ok") == "ok"]
    results: PerSeed = {}
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        seed = row["seed"].strip()
        if seed in seen:
            raise StudyError(f"{path}:{line}: seed {seed} appears twice")
        seen.add(seed)
        for column, text in row.items():
            if column in _NOT_METRICS or column.startswith("environment.") or not text or not text.strip():
                continue
            try:
                results.setdefault(column, {})[seed] = float(text)
            except ValueError:
                raise StudyError(f"{path}:{line}: {column} = {text!r} is not a number") from None
    return results


def _from_study(study: Study) -> PerSeed:
    results: PerSeed = {}
    for record in study.records().values():
        if record.ok and record.arm == VARIED:
            for name, value in record.metrics.items():
                results.setdefault(name, {})[str(record.seed)] = value
    return results


@dataclass
class Comparison:
    metric: str
    a: Sample
    b: Sample
    paired_seeds: list[str]  # empty when unpaired
    difference: float  # mean of B - A (per seed when paired)
    interval: Interval
    test: TestResult
    lower_is_better: bool = False

    @property
    def paired(self) -> bool:
        return bool(self.paired_seeds)

    @property
    def distinguishable(self) -> bool:
        """Only when the bootstrap CI excludes 0 *and* the t-test agrees: with
        a handful of seeds the percentile bootstrap alone is too narrow."""
        return not self.interval.covers(0.0) and self.test.p_value < SIGNIFICANCE

    def verdict(self) -> str:
        improvement = -self.difference if self.lower_is_better else self.difference
        if improvement == 0.0:
            head = f"A and B have the same mean {self.metric}"
        else:
            word = "better" if improvement > 0 else "worse"
            head = f"B is {word} than A by {abs(self.difference):.4g} ± {self.interval.half_width:.2g}"
        ci = f"(95% CI of B - A: {self.interval.low:.4g} to {self.interval.high:.4g}; {self.test.name} p = {self.test.p_value:.3g})"
        if self.distinguishable:
            return f"{head} {ci}; the difference is larger than seed noise"
        return f"{head} {ci}; not distinguishable from seed noise"

    def to_dict(self) -> dict:
        return {
            "metric": self.metric,
            "a": {"n": len(self.a.values), "mean": self.a.mean, "std": self.a.std},
            "b": {"n": len(self.b.values), "mean": self.b.mean, "std": self.b.std},
            "paired": self.paired,
            "paired_seeds": self.paired_seeds,
            "difference_b_minus_a": self.difference,
            "ci95": [self.interval.low, self.interval.high],
            "test": self.test.name,
            "t": self.test.statistic,
            "df": self.test.df,
            "p_value": self.test.p_value,
            "distinguishable": self.distinguishable,
            "verdict": self.verdict(),
        }


def compare_metric(name: str, a: dict[str, float], b: dict[str, float], *, lower_is_better: bool = False) -> Comparison:
    """``a``/``b``: seed -> value.  Raises ValueError below two seeds a side."""
    for label, side in (("A", a), ("B", b)):
        if len(side) < 2:
            raise ValueError(f"{name}: {label} has {len(side)} seed(s); need at least 2")
    common = sorted(set(a) & set(b), key=_seed_order)
    if len(common) >= 2:
        first, second = [a[s] for s in common], [b[s] for s in common]
        test = paired_t_test(first, second)
        interval = mean_difference_interval(first, second, paired=True)
        difference = mean([y - x for x, y in zip(first, second)])
    else:
        first, second = [a[s] for s in sorted(a, key=_seed_order)], [b[s] for s in sorted(b, key=_seed_order)]
        test = welch_t_test(first, second)
        interval = mean_difference_interval(first, second, paired=False)
        difference = mean(second) - mean(first)
        common = []
    return Comparison(name, Sample(first), Sample(second), common, difference, interval, test, lower_is_better)


def _seed_order(seed: str):
    try:
        return (0, float(seed), seed)
    except ValueError:
        return (1, math.inf, seed)
