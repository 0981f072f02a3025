"""Does B really beat A, or is the difference seed noise?

Input: per-seed results of two models, each a CSV with a ``seed`` column and
one column per metric (optionally a ``task`` column: several tasks or data
sets, one row per task and seed), or a ``detaudit variance --out`` folder (its
varied-seed arm).  On the (task, seed) pairs both share, the per-seed
differences are compared (paired bootstrap interval and paired t-test); with
fewer than two in common, the two groups are compared as they are (unpaired
bootstrap and Welch's t-test).  Beside the mean, the interquartile mean and
the probability of improvement with stratified bootstrap intervals
(``robust``), and how many seeds the difference would need (``power``).
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
    sample_std,
    welch_t_test,
)
from detaudit.stats.power import SeedsNeeded, seeds_for_power
from detaudit.stats.robust import (
    interquartile_mean,
    interquartile_mean_interval,
    probability_of_improvement,
    probability_of_improvement_interval,
)
from detaudit.stats.study import VARIED, Study, StudyError

SIGNIFICANCE = 0.05
TASK_COLUMN = "task"
# columns of a `variance` runs.csv that are not metrics
_NOT_METRICS = {"seed", TASK_COLUMN, "arm", "run", "status", "seconds"}

RunKey = tuple[str, str]  # (task, seed); the task is "" when the results have none
PerSeed = dict[str, dict[RunKey, float]]  # metric -> (task, seed) -> value


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
    seen: set[RunKey] = set()
    for line, row in enumerate(rows, start=2):
        key = ((row.get(TASK_COLUMN) or "").strip(), row["seed"].strip())
        if key in seen:
            raise StudyError(f"{path}:{line}: {describe_key(key)} appears twice")
        seen.add(key)
        for column, text in row.items():
            if column in _NOT_METRICS or column.startswith("environment.") or not text or not text.strip():
                continue
            try:
                results.setdefault(column, {})[key] = float(text)
            except ValueError:
                raise StudyError(f"{path}:{line}: {column} = {text!r} is not a number") from None
    return results


def _from_study(study: Study) -> PerSeed:
    results: PerSeed = {}
    for record in study.records().values():
        if record.ok and record.arm == VARIED:
            for name, value in record.metrics.items():
                results.setdefault(name, {})[("", str(record.seed))] = value
    return results


def describe_key(key: RunKey) -> str:
    task, seed = key
    return f"seed {seed}" if not task else f"task {task} seed {seed}"


def _key_label(key: RunKey) -> str:
    task, seed = key
    return seed if not task else f"{task}/{seed}"


@dataclass
class Comparison:
    metric: str
    a: Sample
    b: Sample
    paired_keys: list[RunKey]  # empty when unpaired
    difference: float  # mean of B - A (per seed when paired)
    interval: Interval
    test: TestResult
    tasks: list[str]  # [""] without a task column
    a_strata: list[list[float]]  # per task, the values compared
    b_strata: list[list[float]]
    iqm_a: float
    iqm_a_interval: Interval
    iqm_b: float
    iqm_b_interval: Interval
    improvement: float  # P(B better than A) on a random pair of runs
    improvement_interval: Interval
    seeds_needed: SeedsNeeded
    lower_is_better: bool = False

    @property
    def paired(self) -> bool:
        return bool(self.paired_keys)

    @property
    def paired_seeds(self) -> list[str]:
        return [_key_label(key) for key in self.paired_keys]

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

    def improvement_words(self) -> str:
        interval = self.improvement_interval
        tasks = f", averaged over {len(self.tasks)} tasks" if len(self.tasks) > 1 else ""
        return (
            f"B beats A on a random pair of seeds with probability {self.improvement:.2f}{tasks} "
            f"(95% CI {interval.low:.2f} to {interval.high:.2f}; 0.5 is a coin flip); "
            f"interquartile mean A {self.iqm_a:.4g}, B {self.iqm_b:.4g}"
        )

    def to_dict(self) -> dict:
        return {
            "metric": self.metric,
            "a": {"n": len(self.a.values), "mean": self.a.mean, "std": self.a.std},
            "b": {"n": len(self.b.values), "mean": self.b.mean, "std": self.b.std},
            "paired": self.paired,
            "paired_seeds": self.paired_seeds,
            "tasks": [task for task in self.tasks if task],
            "difference_b_minus_a": self.difference,
            "ci95": self.interval.to_list(),
            "test": self.test.name,
            "t": self.test.statistic,
            "df": self.test.df,
            "p_value": self.test.p_value,
            "distinguishable": self.distinguishable,
            "verdict": self.verdict(),
            "iqm": {
                "a": self.iqm_a,
                "a_ci95": self.iqm_a_interval.to_list(),
                "b": self.iqm_b,
                "b_ci95": self.iqm_b_interval.to_list(),
            },
            "probability_of_improvement": self.improvement,
            "probability_of_improvement_ci95": self.improvement_interval.to_list(),
            "seeds_needed": self.seeds_needed.to_dict(),
        }


def compare_metric(
    name: str, a: dict[RunKey, float], b: dict[RunKey, float], *, lower_is_better: bool = False
) -> Comparison:
    """``a``/``b``: (task, seed) -> value.  Raises ValueError below two seeds a side."""
    for label, side in (("A", a), ("B", b)):
        if len(side) < 2:
            raise ValueError(f"{name}: {label} has {len(side)} seed(s); need at least 2")
    common = sorted(set(a) & set(b), key=_key_order)
    if len(common) >= 2:
        a_keys = b_keys = common
    else:
        a_keys, b_keys, common = sorted(a, key=_key_order), sorted(b, key=_key_order), []
    first, second = [a[key] for key in a_keys], [b[key] for key in b_keys]
    if common:
        differences = [y - x for x, y in zip(first, second)]
        test = paired_t_test(first, second)
        interval = mean_difference_interval(first, second, paired=True)
        difference = mean(differences)
        needed = SeedsNeeded(difference, sample_std(differences), True, len(common),
                             seeds_for_power(difference, sample_std(differences), None))
    else:
        test = welch_t_test(first, second)
        interval = mean_difference_interval(first, second, paired=False)
        difference = mean(second) - mean(first)
        spread_a, spread_b = sample_std(first), sample_std(second)
        needed = SeedsNeeded(difference, max(spread_a, spread_b), False, min(len(first), len(second)),
                             seeds_for_power(difference, spread_a, spread_b))
    tasks = sorted({key[0] for key in (*a_keys, *b_keys)})
    a_strata = [[a[key] for key in a_keys if key[0] == task] for task in tasks]
    b_strata = [[b[key] for key in b_keys if key[0] == task] for task in tasks]
    missing = [task for task, x, y in zip(tasks, a_strata, b_strata) if not x or not y]
    if missing:
        raise ValueError(f"{name}: task {', '.join(missing)} has results for only one of A and B")
    return Comparison(
        metric=name,
        a=Sample(first),
        b=Sample(second),
        paired_keys=common,
        difference=difference,
        interval=interval,
        test=test,
        tasks=tasks,
        a_strata=a_strata,
        b_strata=b_strata,
        iqm_a=interquartile_mean(a_strata),
        iqm_a_interval=interquartile_mean_interval(a_strata),
        iqm_b=interquartile_mean(b_strata),
        iqm_b_interval=interquartile_mean_interval(b_strata),
        improvement=probability_of_improvement(a_strata, b_strata, lower_is_better=lower_is_better),
        improvement_interval=probability_of_improvement_interval(a_strata, b_strata, lower_is_better=lower_is_better),
        seeds_needed=needed,
        lower_is_better=lower_is_better,
    )


def _key_order(key: RunKey):
    task, seed = key
    try:
        return (task, 0, float(seed), seed)
    except ValueError:
        return (task, 1, math.inf, seed)
