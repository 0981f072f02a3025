"""What a variance study says: how much of the seed-to-seed spread of each
metric survives when every seed is fixed (Morin & Willetts 2020 report 0.020 /
0.027, i.e. about 74%, for ResNet test accuracy on GPUs)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from detaudit.stats.numerics import Interval, Sample, pairwise_disagreement, std_ratio_interval
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

    def plain_words(self) -> str:
        if self.fixed.runs < 2 or self.varied.runs < 2:
            return "too few finished runs for a spread (need two per arm)"
        if self.fixed.collapsed:
            return (
                f"all {self.fixed.runs} fixed-seed runs gave exactly {self.fixed.values[0]!r}: "
                "no nondeterminism reached this metric; all of its spread comes from the seed"
            )
        if self.varied.std == 0.0:
            return "the varied-seed runs did not spread at all, so there is no ratio to report"
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
            "in_words": self.plain_words(),
        }


@dataclass
class VarianceSummary:
    metrics: list[MetricSummary]
    disagreement: dict[str, dict[str, float]]  # predictions name -> arm -> average pairwise disagreement
    failed: list[RunRecord] = field(default_factory=list)
    pending: int = 0
    deterministic: bool = False

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
        metrics.append(MetricSummary(name, fixed, varied, ratio, interval))
    return VarianceSummary(
        metrics=metrics,
        disagreement=_disagreement_by_arm(study, finished),
        failed=[r for r in records if not r.ok],
        pending=len(study.pending()),
        deterministic=study.settings.deterministic,
    )


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
    for column in ("metric", "fixed mean", "fixed std", "varied mean", "varied std", "std ratio", "95% CI"):
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
        )
    console.print(table)
    for metric in summary.metrics:
        console.print(f"[bold]{metric.name}[/]: {metric.plain_words()}", soft_wrap=True)
    for name, per_arm in summary.disagreement.items():
        parts = [f"{ARM_TITLES[arm]} {value:.2%}" for arm, value in per_arm.items()]
        console.print(f"predictions [bold]{name}[/]: average pairwise disagreement: {', '.join(parts) or 'n/a'}", soft_wrap=True)
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
