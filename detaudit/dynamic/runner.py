"""``detaudit run``'s engine: run a script R times traced, compare, report.

Each repeat is a fresh subprocess (``launch.run_script``) with the same seed,
stopped after N optimizer steps, writing its op trace and final state.  When
root causes are found, the pair that showed each one is rerun with a targeted
capture of the causing op's tensors to measure the deviation.  A run that
fails (or writes no results) stops the audit with ``ScriptFailed``, naming the
run, how it ended and the tail of its output.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from detaudit.dynamic.launch import LaunchOptions, ScriptResult, run_script
from detaudit.dynamic.report import RunFailure
from detaudit.dynamic.variations import VARIATIONS


class ScriptFailed(Exception):
    """A run of the user's script crashed, was killed, timed out or wrote no results."""

    def __init__(self, failure: RunFailure):
        self.failure = failure
        super().__init__(f"{failure.message}\n{failure.output_tail}".rstrip())


def audit_script(
    script: str,
    script_args: Sequence[str] = (),
    *,
    steps: int = 2,
    repeats: int = 3,
    seed: int | None = 0,
    vary: str | None = None,
    deterministic: bool = False,
    timeout: float | None = None,
    cwd: str | None = None,
    progress: Callable[[str], None] = lambda message: None,
):
    from detaudit.dynamic.analysis import build_report
    from detaudit.dynamic.compare import Trace
    from detaudit.dynamic.state import load_state

    variation = VARIATIONS[vary] if vary else None
    settings = variation.settings(repeats) if variation else []
    base = LaunchOptions(seed=seed, max_steps=steps, deterministic=deterministic, trace=True, save_state=True)

    def options_for(repeat: int, output_dir: Path, **extra) -> LaunchOptions:
        if variation:
            extra[variation.launch_option] = settings[repeat]
        return replace(base, output_dir=output_dir, **extra)

    warnings: list[str] = []

    def launch(repeat: int, options: LaunchOptions) -> ScriptResult:
        result = run_script(script, script_args, options=options, timeout=timeout, cwd=cwd)
        which = f"the capture rerun of run {repeat + 1}" if options.capture_ops else f"run {repeat + 1}"
        if result.failed or not result.wrote_results:
            raise ScriptFailed(RunFailure.of(script, which, result, repeats=repeats, steps=steps))
        warnings.extend(f"{which} {warning}" for warning in result.warnings)
        return result

    with tempfile.TemporaryDirectory(prefix="detaudit-run-") as workdir:
        results = []
        for repeat in range(repeats):
            progress(f"run {repeat + 1}/{repeats}")
            options = options_for(repeat, Path(workdir) / f"run{repeat}", record_environment=repeat == 0)
            results.append(launch(repeat, options))
        traces = [Trace.load(result.payload["trace_file"]) for result in results]
        states = [load_state(result.payload["state_file"]) for result in results]

        def capture(other: int, records: list[int]) -> tuple[dict, dict]:
            import torch

            captured = []
            for repeat in (0, other):
                progress(f"capturing the root-cause tensors of run {repeat + 1}")
                options = options_for(repeat, Path(workdir) / f"capture{repeat}", capture_ops=tuple(records))
                payload = launch(repeat, options).payload
                captured.append(torch.load(payload["capture_file"], weights_only=True) if "capture_file" in payload else {})
            return captured[0], captured[1]

        report = build_report(
            script,
            traces,
            states,
            steps=steps,
            environment=results[0].payload.get("environment", {}),
            capture=capture,
            variation=variation,
        )
    report.steps_run = [result.payload["steps"] for result in results]
    if not any(report.steps_run):
        warnings.insert(0, _no_step_warning(len(traces[0].ops), len(states[0])))
    report.warnings = warnings
    return report


def _no_step_warning(ops: int, tensors: int) -> str:
    return (
        "no optimizer step ran (the script never called optimizer.step()): the runs were compared over "
        f"the whole script instead, {ops} traced ops and {tensors} final tensors (the modules it called"
        " and the last loss), not over training steps"
    )
