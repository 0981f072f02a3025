"""Summers & Dinneen's (ICML 2021) instability probe.

Three deterministic runs of one script: as is (the baseline); from the same
seed with one randomly chosen weight of the first parameter tensor moved by
one ULP at the first optimizer step; and from another seed.  If the one-ULP
run ends as far from the baseline as the reseeded run, the training is
unstable: any nondeterminism, however small, costs as much as a new seed
(their ResNet-14/CIFAR-10 result: same accuracy SD, ~10.7% disagreement).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from detaudit.report.progress import RunProgress
from detaudit.stats.numerics import json_safe, pairwise_disagreement, pearson_correlation, relative_l2_distance
from detaudit.stats.runner import OUTPUT_TAIL_LINES, launch, run_status

BASELINE, ONE_ULP, RESEED = "baseline", "one ULP", "reseed"
VARIANTS = (BASELINE, ONE_ULP, RESEED)
# the one-ULP run "diverges as far as a reseed" when its divergence from the
# baseline is at least this share of the reseeded run's
AS_FAR_AS_RESEED = 0.5
NOTICEABLE = 0.01  # below this share the one-ULP run is as good as the baseline


@dataclass
class ProbeRun:
    variant: str
    seed: int
    status: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    history: dict[str, dict[int, float]] = field(default_factory=dict)
    predictions: dict[str, Path] = field(default_factory=dict)
    state_file: Path | None = None
    perturbed: dict = field(default_factory=dict)  # which element moved, old and new value
    failure: str = ""


def run_probe(
    script: str,
    script_args: list[str],
    folder: Path,
    *,
    seed: int,
    reseed: int,
    perturb_seed: int,
    steps: int,
    threads: int | None,
    jobs: int,
    timeout: float | None,
    progress: RunProgress,
    distributed=None,
) -> dict[str, ProbeRun]:
    """Runs the three variants (up to ``jobs`` at a time), deterministic mode on;
    ``distributed`` (a ``torchrun.Distributed``): each under torchrun, rank 0's
    metrics and state compared (every rank moves the same weight by one ULP)."""
    from detaudit.dynamic.record.features import SaveFinalState
    from detaudit.launch.options import LaunchOptions
    from detaudit.launch.process import terminate_all
    from detaudit.stats.perturbation import PerturbOneUlp
    from detaudit.stats.runner import run_settings

    cancel = threading.Event()  # set on Ctrl-C: a run that starts after it kills itself

    def one(variant: str) -> ProbeRun:
        run = ProbeRun(variant, reseed if variant == RESEED else seed)
        progress.started(variant)
        started = time.monotonic()
        options = LaunchOptions(
            seed=run.seed,
            max_steps=steps,
            settings=run_settings(hash_seed=str(seed), threads=threads, deterministic=True),
            features=(SaveFinalState(), *((PerturbOneUlp(perturb_seed),) if variant == ONE_ULP else ())),
        )
        result, outputs = launch(
            script, script_args, folder / variant.replace(" ", "-"), options, timeout, cancel=cancel,
            distributed=distributed,
        )
        run.status = run_status(result, outputs, require_metrics=False)
        run.metrics, run.history, run.predictions = outputs.final, outputs.history, outputs.predictions
        run.perturbed = result.payload.get("perturbed", {})
        state_file = result.payload.get("state_file")
        run.state_file = Path(state_file) if state_file and Path(state_file).is_file() else None
        if run.status != "ok":
            run.failure = "\n".join([result.describe_failure(OUTPUT_TAIL_LINES), *outputs.problems])
        seconds = time.monotonic() - started
        progress.finished(variant, f"seed {run.seed}, {run.status} in {seconds:.1f} s", ok=run.status == "ok")
        return run

    with progress, ThreadPoolExecutor(max_workers=max(1, min(jobs, len(VARIANTS)))) as pool:
        futures = [pool.submit(one, variant) for variant in VARIANTS]
        try:
            return dict(zip(VARIANTS, (future.result() for future in futures)))
        except BaseException:  # Ctrl-C reaches this thread only: kill the runs in the workers, start none
            cancel.set()
            terminate_all()
            raise


def trained_parameters(state_file: Path) -> dict:
    """The floating-point tensors of a saved end state that are model weights
    (not gradients, optimizer state or the loss), as float64 numpy arrays."""
    from detaudit.dynamic.record.final_state import load_state

    return {
        name: tensor.double().numpy()
        for name, tensor in load_state(state_file).items()
        if tensor.is_floating_point() and name != "loss" and not name.endswith(".grad") and not name.startswith("optimizer.")
    }


@dataclass
class Divergence:
    """How far one variant ended from the baseline."""

    parameter_distance: float | None = None  # relative L2 over the trained weights
    metric_differences: dict[str, float] = field(default_factory=dict)  # final value minus baseline
    disagreement: dict[str, float] = field(default_factory=dict)  # predictions name -> fraction
    correlation: dict[str, float] = field(default_factory=dict)  # predictions name -> Pearson
    first_differing_step: dict[str, int | None] = field(default_factory=dict)  # metric -> step


def divergence(baseline: ProbeRun, other: ProbeRun) -> Divergence:
    import numpy as np

    result = Divergence()
    if baseline.state_file and other.state_file:
        result.parameter_distance = relative_l2_distance(
            trained_parameters(baseline.state_file), trained_parameters(other.state_file)
        )
    for name in sorted(set(baseline.metrics) & set(other.metrics)):
        result.metric_differences[name] = other.metrics[name] - baseline.metrics[name]
    for name in sorted(set(baseline.history) & set(other.history)):
        common_steps = sorted(set(baseline.history[name]) & set(other.history[name]))
        result.first_differing_step[name] = next(
            (step for step in common_steps if baseline.history[name][step] != other.history[name][step]), None
        )
    for name in sorted(set(baseline.predictions) & set(other.predictions)):
        first, second = np.load(baseline.predictions[name]), np.load(other.predictions[name])
        result.disagreement[name] = pairwise_disagreement([first, second])
        result.correlation[name] = pearson_correlation(first, second)
    return result


@dataclass
class ProbeReport:
    runs: dict[str, ProbeRun]
    ulp: Divergence
    reseed: Divergence

    @property
    def measure(self) -> tuple[str, float, float] | None:
        """(what, one-ULP value, reseed value) the verdict rests on: the
        disagreement of logged predictions when there are some (Summers &
        Dinneen's functional measure: weights of two equally good models can be
        far apart), else the relative L2 distance of the final weights."""
        if self.ulp.disagreement and self.reseed.disagreement:
            name = next(iter(self.ulp.disagreement))
            return f"disagreement on predictions '{name}'", self.ulp.disagreement[name], self.reseed.disagreement[name]
        if self.ulp.parameter_distance is not None and self.reseed.parameter_distance is not None:
            return "relative L2 distance of the final weights", self.ulp.parameter_distance, self.reseed.parameter_distance
        return None

    @property
    def ulp_share(self) -> float | None:
        """The one-ULP run's divergence as a share of the reseeded run's."""
        measure = self.measure
        if measure is None or measure[2] == 0.0:
            return None
        return measure[1] / measure[2]

    def conclusion(self) -> str:
        if self.ulp.parameter_distance == 0.0:
            return (
                "the one-ULP change left no trace: the final weights are bitwise identical to the baseline "
                "(the perturbed weight was overwritten or never used)"
            )
        share = self.ulp_share
        if share is None:
            return "nothing to compare: the runs saved no trained weights and logged no predictions, or the reseed changed nothing"
        what, ulp, reseed = self.measure
        facts = f"{what}: {ulp:.3g} after one ULP vs {reseed:.3g} after a reseed ({share:.2g} of it)"
        if share >= AS_FAR_AS_RESEED:
            return (
                f"UNSTABLE: one ULP in one weight diverged about as far as a new seed; {facts}. "
                "Any nondeterminism in this training costs as much as reseeding: "
                "compare models over several seeds, or make training deterministic."
            )
        if share >= NOTICEABLE:
            return (
                f"partly unstable: the one-ULP change grew into a noticeable difference; {facts}. "
                "Longer training usually takes it further."
            )
        return (
            f"stable to one ULP at this length: {facts}; "
            "the tiny change did not grow into a different model (longer training often changes this)."
        )

    def to_dict(self) -> dict:
        def run_dict(run: ProbeRun) -> dict:
            return {
                "seed": run.seed,
                "status": run.status,
                "metrics": run.metrics,
                "history": {name: {str(step): value for step, value in steps.items()} for name, steps in run.history.items()},
                "perturbed": run.perturbed,
            }

        def divergence_dict(d: Divergence) -> dict:
            return {
                "parameter_relative_l2": d.parameter_distance,
                "metric_differences": d.metric_differences,
                "first_differing_step": d.first_differing_step,
                "disagreement": d.disagreement,
                "correlation": d.correlation,
            }

        return json_safe(
            {
                "runs": {variant: run_dict(run) for variant, run in self.runs.items()},
                "one_ulp_vs_baseline": divergence_dict(self.ulp),
                "reseed_vs_baseline": divergence_dict(self.reseed),
                "verdict_measure": self.measure[0] if self.measure else None,
                "one_ulp_share_of_reseed": self.ulp_share,
                "conclusion": self.conclusion(),
            }
        )


def analyse(runs: dict[str, ProbeRun]) -> ProbeReport:
    return ProbeReport(runs, divergence(runs[BASELINE], runs[ONE_ULP]), divergence(runs[BASELINE], runs[RESEED]))


def _format(value: float | None, pattern: str) -> str:
    return "n/a" if value is None else format(value, pattern)


def render(report: ProbeReport, console, max_steps_shown: int = 8) -> None:
    from rich.table import Table

    perturbed = report.runs[ONE_ULP].perturbed
    if perturbed:
        console.print(
            f"one ULP: {perturbed.get('param') or 'first parameter'}[{perturbed.get('index')}] "
            f"{perturbed.get('old')!r} -> {perturbed.get('new')!r} before the first optimizer step",
            highlight=False,
        )
    table = Table(title="distance from the baseline run", title_justify="left")
    table.add_column("")
    table.add_column(ONE_ULP, justify="right")
    table.add_column(RESEED, justify="right")
    table.add_row(
        "weights, relative L2",
        _format(report.ulp.parameter_distance, ".3g"),
        _format(report.reseed.parameter_distance, ".3g"),
    )
    for name, difference in report.ulp.metric_differences.items():
        table.add_row(f"{name} (final) - baseline", f"{difference:+.4g}", _format(report.reseed.metric_differences.get(name), "+.4g"))
    for name, value in report.ulp.disagreement.items():
        table.add_row(f"{name}: disagreement", f"{value:.2%}", _format(report.reseed.disagreement.get(name), ".2%"))
        table.add_row(f"{name}: correlation", f"{report.ulp.correlation[name]:.4f}", _format(report.reseed.correlation.get(name), ".4f"))
    for name, step in report.ulp.first_differing_step.items():
        table.add_row(f"{name}: first differing step", str(step), str(report.reseed.first_differing_step.get(name)))
    console.print(table)
    _render_history(report, console, max_steps_shown)
    console.print(f"[bold]{report.conclusion()}[/]", highlight=False, soft_wrap=True)


def _render_history(report: ProbeReport, console, max_steps_shown: int) -> None:
    """A few logged steps of each per-step metric, in all three runs."""
    from rich.table import Table

    baseline = report.runs[BASELINE]
    for name, steps in baseline.history.items():
        ordered = sorted(steps)
        if len(ordered) > max_steps_shown:
            stride = (len(ordered) - 1) / (max_steps_shown - 1)
            ordered = sorted({ordered[round(i * stride)] for i in range(max_steps_shown)})
        table = Table(title=f"{name} per logged step", title_justify="left")
        table.add_column("step", justify="right")
        for variant in VARIANTS:
            table.add_column(variant, justify="right")
        for step in ordered:
            table.add_row(str(step), *(_format(report.runs[v].history.get(name, {}).get(step), ".6g") for v in VARIANTS))
        console.print(table)
