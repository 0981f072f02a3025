"""Aggregates that hold up with few runs, after Agarwal et al. (NeurIPS 2021),
"Deep Reinforcement Learning at the Edge of the Statistical Precipice":

* the interquartile mean (IQM): the mean of the middle 50% of all runs, less
  thrown by one outlier seed than the mean and less wasteful than the median;
* stratified bootstrap intervals: runs are resampled within each stratum
  (task) on its own, so every resample keeps every task;
* the probability of improvement: how likely B beats A on a random pair of
  runs (one seed of each), averaged over tasks; 0.5 is a coin flip.

Strata are lists of per-seed values, one list per task (a single list when
the results have no task column).  Scores of different tasks are pooled as
they are: put them on one scale first (normalised scores) when they differ.
"""

from __future__ import annotations

from typing import Sequence

from detaudit.stats.numerics import Interval, bootstrap_interval

IQM_CUT = 0.25  # trim a quarter of the runs at each end


def _pooled(strata):
    """The strata's values side by side along the last axis (resampled
    strata come as (..., n) batches, fixed ones as (n,))."""
    import numpy as np

    batch = np.broadcast_shapes(*(np.shape(stratum)[:-1] for stratum in strata))
    return np.concatenate([np.broadcast_to(stratum, batch + np.shape(stratum)[-1:]) for stratum in strata], axis=-1)


def _iqm_of_pooled(*strata):
    from scipy import stats

    return stats.trim_mean(_pooled(strata), IQM_CUT, axis=-1)


def interquartile_mean(strata: Sequence[Sequence[float]]) -> float:
    """IQM of every run of every stratum (``scipy.stats.trim_mean``, 25% cut)."""
    return float(_iqm_of_pooled(*strata))


def interquartile_mean_interval(strata: Sequence[Sequence[float]]) -> Interval:
    """Stratified bootstrap interval of the IQM."""
    return bootstrap_interval(strata, _iqm_of_pooled)


def _improvement_statistic(task_count: int, lower_is_better: bool):
    def statistic(*strata):
        import numpy as np

        per_task = []
        for a, b in zip(strata[:task_count], strata[task_count:]):
            a, b = np.asarray(a)[..., :, None], np.asarray(b)[..., None, :]
            wins = (b < a) if lower_is_better else (b > a)
            per_task.append(wins.mean(axis=(-2, -1)) + 0.5 * (b == a).mean(axis=(-2, -1)))
        return sum(per_task) / task_count

    return statistic


def probability_of_improvement(
    a_strata: Sequence[Sequence[float]], b_strata: Sequence[Sequence[float]], *, lower_is_better: bool = False
) -> float:
    """P(B beats A) on a random pair of runs (one of A, one of B) of the same
    task, ties counting half, averaged over tasks: the Mann-Whitney U
    statistic over N x M, as in Agarwal et al."""
    return float(_improvement_statistic(len(a_strata), lower_is_better)(*a_strata, *b_strata))


def probability_of_improvement_interval(
    a_strata: Sequence[Sequence[float]], b_strata: Sequence[Sequence[float]], *, lower_is_better: bool = False
) -> Interval:
    """Stratified bootstrap interval of the probability of improvement (A's and
    B's runs resampled independently within each task)."""
    return bootstrap_interval([*a_strata, *b_strata], _improvement_statistic(len(a_strata), lower_is_better))
