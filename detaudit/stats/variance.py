"""What a variance study says: how much of the seed-to-seed spread of each
metric survives when every seed is fixed (Morin & Willetts 2020 report 0.020 /
0.027, i.e. about 74%, for ResNet test accuracy on GPUs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from detaudit.stats.numerics import Interval, Sample, pairwise_disagreement, std_ratio_interval
from detaudit.stats.power import ALPHA, POWER, detectable_difference
from detaudit.stats.runner import LET_DETAUDIT_SEED
from detaudit.stats.study import ARMS, FIXED, VARIED, RunRecord, Study

ARM_TITLES = {FIXED: "fixed seed", VARIED: "varied seeds"}


def percent(share: float) -> str:
    """74% for ordinary shares; two significant digits for tiny ones (0.00075%)."""
    if math.isnan(share):
        return "n/a"
    return f"{share:.0%}" if share == 0.0 or share >= 0.01 else f"{share * 100:.2g}%"


#: one arm of a variance study (fixed or varied seeds)
ArmSummary = Sample


@dataclass
class MetricSummary:
    name: str
    fixed: ArmSummary
    varied: ArmSummary
    ratio: float  # std_fixed / std_varied
    ratio_interval: Interval
    # the smallest difference between two models, each run with as many seeds
    # as this study's varied arm, that Welch's t-test detects at its spread
    detectable: float = math.nan

    def plain_words(self) -> str:
        if self.fixed.runs < 2 or self.varied.runs < 2:
            return "too few finished runs for a spread (need two per arm)"
        if self.varied.collapsed:
            if self.fixed.collapsed and self.fixed.values[0] == self.varied.values[0]:
                return (
                    f"all {self.fixed.runs + self.varied.runs} runs gave exactly {self.varied.values[0]!r}: "
                    "neither nondeterminism nor the seeds detaudit started the runs at changed this metric"
                )
            return (
                f"the {self.varied.runs} varied-seed runs all gave exactly {self.varied.values[0]!r} although "
                "each had its own seed: the seed never reached this metric, so its spread cannot be split"
            )
        if self.fixed.collapsed:
            return (
                f"all {self.fixed.runs} fixed-seed runs gave exactly {self.fixed.values[0]!r}: "
                "no nondeterminism reached this metric; all of its spread comes from the seed"
            )
        interval = self.ratio_interval
        share = (
            f"about {percent(self.ratio)} of the seed-to-seed standard deviation remains with every seed fixed "
            f"(95% CI {percent(interval.low)} to {percent(interval.high)}): that part is nondeterminism, "
            "the rest comes from the seeds (initialisation, data order)"
        )
        if interval.low >= 1.0 or self.ratio >= 1.0:
            share += "; nondeterminism alone spreads this metric as much as a new seed does"
        return share

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **{
                arm: {"runs": summary.runs, "mean": summary.mean, "std": summary.std, "values": summary.values}
                for arm, summary in ((FIXED, self.fixed), (VARIED, self.varied))
            },
            "std_ratio": self.ratio,
            "std_ratio_ci95": [self.ratio_interval.low, self.ratio_interval.high],
            "fixed_collapsed": self.fixed.collapsed,
            "varied_collapsed": self.varied.collapsed,
            "detectable_difference": {
                "difference": self.detectable,
                "seeds_per_model": self.varied.runs,
                "test": "Welch's t-test",
                "alpha": ALPHA,
                "power": POWER,
            },
            "in_words": self.plain_words(),
        }


@dataclass
class VarianceSummary:
    metrics: list[MetricSummary]
    disagreement: dict[str, dict[str, float]]  # predictions name -> arm -> average pairwise disagreement
    failed: list[RunRecord] = field(default_factory=list)
    pending: int = 0
    deterministic: bool = False
    seed_not_varied: str | None = None  # why the varied-seed arm is not what it says, and what to do

    @property
    def determinism_proven(self) -> bool | None:
        """With ``--deterministic``: did every metric's fixed arm collapse?"""
        if not self.deterministic or not self.metrics:
            return None
        return all(metric.fixed.collapsed for metric in self.metrics)

    def to_dict(self) -> dict[str, Any]:
        return {
            "metrics": [metric.to_dict() for metric in self.metrics],
            "pairwise_disagreement": self.disagreement,
            "failed_runs": [{"run": r.run_id, "status": r.status, "returncode": r.returncode} for r in self.failed],
            "pending_runs": self.pending,
            "deterministic": self.deterministic,
            "determinism_proven": self.determinism_proven,
            "seed_not_varied": self.seed_not_varied,
        }


def metric_names(records: list[RunRecord]) -> list[str]:
    return sorted({name for record in records if record.ok for name in record.metrics})


def summarize(study: Study, wanted: list[str] | None = None) -> VarianceSummary:
    """The statistics of every finished run in ``study`` (``wanted``: metric
    names to keep; unknown names raise ValueError listing the known ones)."""
    records = list(study.records().values())
    finished = [r for r in records if r.ok]
    names = metric_names(records)
    if wanted:
        unknown = [name for name in wanted if name not in names]
        if unknown:
            raise ValueError(
                f"no run logged metric {', '.join(unknown)} (logged: {', '.join(names) or 'nothing'})"
            )
        names = [name for name in names if name in wanted]
    metrics = []
    for name in names:
        fixed, varied = (
            ArmSummary([r.metrics[name] for r in sorted(finished, key=lambda r: r.index) if r.arm == arm and name in r.metrics])
            for arm in ARMS
        )
        with_spread = fixed.runs >= 2 and varied.runs >= 2
        ratio = fixed.std / varied.std if with_spread and varied.std else math.nan
        interval = std_ratio_interval(fixed.values, varied.values) if with_spread and varied.std else Interval(math.nan, math.nan)
        detectable = detectable_difference(varied.std, varied.runs) if with_spread and varied.std else math.nan
        metrics.append(MetricSummary(name, fixed, varied, ratio, interval, detectable))
    return VarianceSummary(
        metrics=metrics,
        disagreement=_disagreement_by_arm(study, finished),
        failed=[r for r in records if not r.ok],
        pending=len(study.pending()),
        deterministic=study.settings.deterministic,
        seed_not_varied=seed_not_varied(finished, metrics),
    )


def seed_not_varied(finished: list[RunRecord], metrics: list[MetricSummary]) -> str | None:
    """Why the varied-seed arm did not vary with its seeds, when it did not.

    Two signs: every metric's varied-seed runs gave one value, and the torch
    seed the script logged with is not the one detaudit started it at (the
    script called ``torch.manual_seed`` itself, e.g. with its ``--seed``
    default).  detaudit seeds the process before the script starts; a script
    that seeds itself again replaces that seed with its own."""
    varied = [r for r in finished if r.arm == VARIED]
    reseeded = [r for r in finished if r.torch_seed is not None and r.torch_seed != r.seed]
    script_seeds = sorted({r.torch_seed for r in varied if r.torch_seed is not None})
    seeds = sorted({r.seed for r in varied})
    collapsed = len(seeds) >= 2 and bool(metrics) and all(m.varied.collapsed for m in metrics)
    one_script_seed = len(seeds) >= 2 and len(script_seeds) == 1 and reseeded
    evidence = []
    if collapsed:
        evidence.append(f"all {len(varied)} varied-seed runs gave exactly the same value for every metric")
    if reseeded:
        example = reseeded[0]
        what = (
            f"every varied-seed run ran at torch seed {script_seeds[0]}"
            if one_script_seed
            else f"{len(reseeded)} run(s) ran at a torch seed of the script's choosing (run {example.run_id}: {example.torch_seed})"
        )
        evidence.append(f"{what} although detaudit started them at seeds {_seed_range(seeds)} (torch.initial_seed() when they logged)")
    if not evidence:
        return None
    if collapsed or one_script_seed:
        head = "The varied-seed runs did not vary: "
        why = (
            "the script most likely seeds itself from its own default (e.g. torch.manual_seed(args.seed)), "
            "which replaces the seed detaudit sets before it starts, so the varied arm repeats the fixed one"
        )
    else:
        head = "The script sets torch's seed itself: "
        why = "the arms may not differ by their seeds alone"
    return f"{head}{'; '.join(evidence)}: {why}. To {LET_DETAUDIT_SEED}."


def _seed_range(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]} to {seeds[-1]}"
    return ", ".join(str(seed) for seed in seeds)


def _disagreement_by_arm(study: Study, finished: list[RunRecord]) -> dict[str, dict[str, float]]:
    import numpy as np

    result: dict[str, dict[str, float]] = {}
    for name in sorted({name for r in finished for name in r.predictions}):
        per_arm = {}
        for arm in ARMS:
            arrays = [np.load(study.folder / r.predictions[name]) for r in finished if r.arm == arm and name in r.predictions]
            if len(arrays) >= 2:
                per_arm[arm] = pairwise_disagreement(arrays)
        result[name] = per_arm
    return result


def _number(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.4g}"


def render(summary: VarianceSummary, console) -> None:
    """Prints the study's statistics as rich tables and sentences."""
    from rich.table import Table

    table = Table(title="variance: fixed seed vs varied seeds", title_justify="left")
    columns = ("metric", "fixed mean", "fixed std", "varied mean", "varied std", "std ratio", "95% CI", "detectable Δ")
    for column in columns:
        table.add_column(column, justify="left" if column == "metric" else "right")
    for metric in summary.metrics:
        interval = metric.ratio_interval
        table.add_row(
            metric.name,
            _number(metric.fixed.mean),
            _number(metric.fixed.std),
            _number(metric.varied.mean),
            _number(metric.varied.std),
            _number(metric.ratio),
            "n/a" if math.isnan(interval.low) else f"{_number(interval.low)}–{_number(interval.high)}",
            _number(metric.detectable),
        )
    console.print(table)
    seeds = max((metric.varied.runs for metric in summary.metrics), default=0)
    if any(not math.isnan(metric.detectable) for metric in summary.metrics):
        console.print(
            f"detectable Δ: the smallest difference between two models, each run with {seeds} seeds, that Welch's "
            f"t-test (two-sided, α = {ALPHA:g}) finds with {POWER:.0%} power at the varied-seed spread",
            soft_wrap=True,
            highlight=False,
        )
    for metric in summary.metrics:
        console.print(f"[bold]{metric.name}[/]: {metric.plain_words()}", soft_wrap=True)
    for name, per_arm in summary.disagreement.items():
        parts = [f"{ARM_TITLES[arm]} {value:.2%}" for arm, value in per_arm.items()]
        console.print(f"predictions [bold]{name}[/]: average pairwise disagreement: {', '.join(parts) or 'n/a'}", soft_wrap=True)
    if summary.seed_not_varied:
        console.print(f"[yellow]{summary.seed_not_varied}[/]", soft_wrap=True, highlight=False)
    verdict = summary.determinism_proven
    if verdict is True:
        console.print(
            "[green]Deterministic mode: the fixed-seed arm collapsed to a single value for every metric "
            "(std_fixed = 0 exactly) — determinism works for this script.[/]",
            soft_wrap=True,
        )
    elif verdict is False:
        spread = ", ".join(m.name for m in summary.metrics if not m.fixed.collapsed)
        console.print(
            f"[red]Deterministic mode did NOT make the fixed-seed runs identical ({spread}): "
            "something escapes it; audit the script with the dynamic pass.[/]",
            soft_wrap=True,
        )
    for record in summary.failed:
        console.print(f"[red]run {record.run_id} (seed {record.seed}) {record.status}[/]")
    if summary.pending:
        console.print(f"{summary.pending} planned run(s) have not finished yet: run the same command again to resume.")
