"""``detaudit resume``'s engine: the three runs and the report.

The runs go one after the other, in the working directory the script runs
in, so that the checkpoint the interrupted run writes is the one the resumed
run reads (the straight run goes first: a checkpoint it writes is
overwritten).  Only the resumed run gets the resume arguments.  No run is
traced: digests at the step boundaries are all a comparison needs, and a
difference is measured, in the resumed run, against the tensors the
straight run kept of the first compared step.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path

from detaudit.launch.features import RecordEnvironment
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import run_script
from detaudit.resume.compare import compared_steps, differences
from detaudit.resume.feature import STATE_FILE, ResumeState
from detaudit.resume.presets import CHECKPOINT, PRESETS
from detaudit.resume.report import DIVERGES, EQUIVALENT, ERROR, ResumeReport

RUNS = ("straight", "interrupted", "resumed")


def resume_arguments(resume_args: str, interrupt_at: int, checkpoint: str = "") -> list[str]:
    """The resume arguments split as a shell would, ``{step}`` replaced by the
    step of the interruption and ``{checkpoint}`` by the checkpoint's path."""
    return [
        argument.replace("{step}", str(interrupt_at)).replace(CHECKPOINT, checkpoint)
        for argument in shlex.split(resume_args)
    ]


def audit_resume(
    script: str | Path,
    interrupt_at: int,
    resume_args: str = "",
    *,
    preset: str | None = None,
    steps: int | None = None,
    script_args: list[str] | tuple = (),
    seed: int | None = 0,
    timeout: float = 600.0,
    cwd: str | Path | None = None,
    progress=None,
) -> ResumeReport:
    """Run ``script`` straight, interrupted before step ``interrupt_at + 1``
    and resumed with ``resume_args`` (after the ``preset``'s, a name of
    ``PRESETS``); compare the resumed run with the straight one at every step
    boundary after the interruption."""
    if interrupt_at < 1:
        raise ValueError(f"--interrupt-at must be at least 1, got {interrupt_at}")
    steps = steps if steps is not None else 2 * interrupt_at
    if steps <= interrupt_at:
        raise ValueError(f"--steps ({steps}) must be more than --interrupt-at ({interrupt_at})")
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    chosen = PRESETS[preset] if preset else None
    resume_args = " ".join(a for a in (chosen.resume_args if chosen else "", resume_args) if a)
    if not resume_args and not (chosen and chosen.framework):
        raise ValueError("nothing makes the resumed run resume: give --resume-args or --preset")
    framework = chosen.framework if chosen else ""
    report = ResumeReport(str(script), interrupt_at, steps, ERROR)
    base = [str(a) for a in script_args]
    results = {}
    with tempfile.TemporaryDirectory(prefix="detaudit-resume-") as workdir:

        def plan(name: str) -> tuple[list[str], int, ResumeState]:
            """A run's arguments, step limit and feature, from what the runs before it left."""
            if name == "straight":
                return base, steps, ResumeState(keep_step=interrupt_at + 1, point_step=interrupt_at + 1)
            if name == "interrupted":
                return base, 0, ResumeState(stop_before_step=interrupt_at + 1)
            # the resumed run's first step against the straight run's there: its tensors, its digests at the point
            return base + resume_arguments(resume_args, interrupt_at, report.checkpoint), steps - interrupt_at, ResumeState(
                keep_step=1, measure_against=str(Path(workdir) / "straight" / STATE_FILE),
                resume_through=framework, checkpoint=report.checkpoint,
                point_step=1, point_expected=results["straight"].payload.get("resume_point"),
            )

        for index, name in enumerate(RUNS):
            if progress:
                progress(f"{name} run ({index + 1}/3)")
            args, max_steps, feature = plan(name)
            # (the environment once: the runs share the machine)
            features = (feature, RecordEnvironment()) if name == "straight" else (feature,)
            options = LaunchOptions(seed=seed, max_steps=max_steps, output_dir=Path(workdir) / name, features=features)
            result = results[name] = run_script(script, args, options=options, timeout=timeout, cwd=cwd)
            if result.failed or not result.wrote_results:
                report.error = f"the {name} run of the script {result.describe_exit()}\n{result.output_tail()}".strip()
                return report
            if name == "interrupted" and not _find_checkpoint(report, result, CHECKPOINT in resume_args or bool(framework)):
                return report
        _judge(report, results, cwd)
    return report


def _find_checkpoint(report: ResumeReport, interrupted, needed: bool) -> bool:
    """The newest checkpoint the interrupted run wrote, into ``report.checkpoint``;
    False (with the error) when the resume needs one and there is none from step K."""
    writes = [write for write in interrupted.payload.get("checkpoint_writes", []) if os.path.exists(write["path"])]
    newest = writes[-1] if writes else None
    if newest and newest["after_step"] == report.interrupt_at:
        report.checkpoint = newest["path"]
    if not needed or report.checkpoint:
        return True
    k = report.interrupt_at
    found = f"its newest is from after step {newest['after_step']}" if newest else "it wrote none"
    report.error = (
        f"the interrupted run wrote no checkpoint after step {k} to resume from ({found}): a script that "
        "checkpoints every M steps is audited with --interrupt-at a multiple of M"
    )
    return False


def _judge(report: ResumeReport, results: dict, cwd) -> None:
    interrupt_at = report.interrupt_at
    root = os.path.abspath(cwd or os.getcwd()) + os.sep
    # a load the straight run makes too is setup, not the resume (accelerate's prepare reloads each optimizer)
    setup = {(c["call"], c["path"], c["line"]) for c in results["straight"].payload.get("checkpoint_calls", [])}
    for name in ("interrupted", "resumed"):
        for call in results[name].payload.get("checkpoint_calls", []):
            if name == "resumed" and (call["call"], call["path"], call["line"]) in setup:
                continue
            report.checkpoint_calls.append({**call, "path": call["path"].removeprefix(root), "run": name})
    report.environment = results["straight"].payload.get("environment", {})
    made = {name: results[name].payload.get("steps", 0) for name in RUNS}
    if made["interrupted"] < interrupt_at:
        report.error = (
            f"the script made {made['interrupted']} optimizer steps, fewer than --interrupt-at {interrupt_at}: "
            "there was nothing to interrupt"
        )
        return
    if not report.loaded_at:
        report.error = (
            "the resumed run loaded no checkpoint (no torch.load or load_state_dict was called): "
            "the resume arguments had no effect"
        )
        return
    if made["straight"] < report.steps:
        report.warnings.append(f"the straight run ended after {made['straight']} of {report.steps} steps")
    straight = results["straight"].payload.get("resume_boundaries", [])
    resumed = results["resumed"].payload.get("resume_boundaries", [])
    report.compared_steps = compared_steps(straight, resumed, interrupt_at)
    if not report.compared_steps:
        report.error = "the resumed run made no optimizer step: there was nothing to compare"
        return
    report.differences = differences(straight, resumed, interrupt_at)
    report.verdict = DIVERGES if report.differences else EQUIVALENT
    deviations = results["resumed"].payload.get("resume_deviations", {})  # of the first compared step's start
    read_by = results["resumed"].payload.get("first_readers", {})  # in the first compared step
    for difference in report.differences:
        if difference.step == interrupt_at + 1:
            difference.read_by = read_by.get(difference.component)
        if (difference.step, difference.at) == (interrupt_at + 1, "start"):
            measured = [deviations.get(f"{difference.component}:{name}") for name in difference.names]
            difference.max_abs_diff = max((m for m in measured if m is not None), default=None)
