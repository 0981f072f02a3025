"""``detaudit run``'s engine: run a script R times traced, compare, report.

Each repeat is a fresh subprocess (``launch.run_script``) with the same seed,
stopped after N optimizer steps, writing its op trace and final state.  When
root causes are found, the pair that showed each one is rerun with a targeted
capture of the causing op's tensors to measure the deviation.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from detaudit.dynamic.launch import LaunchOptions, ScriptResult, run_script
from detaudit.dynamic.variations import VARIATIONS


class ScriptFailed(Exception):
    """A repeat of the user's script crashed, exited non-zero or timed out."""

    def __init__(self, repeat: int, result: ScriptResult):
        self.repeat = repeat
        self.result = result
        super().__init__(f"run {repeat + 1} of the script {result.describe_failure()}")


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

    def launch(repeat: int, options: LaunchOptions) -> ScriptResult:
        result = run_script(script, script_args, options=options, timeout=timeout, cwd=cwd)
        if result.failed:
            raise ScriptFailed(repeat, result)
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

        return build_report(
            script,
            traces,
            states,
            steps=steps,
            environment=results[0].payload.get("environment", {}),
            capture=capture,
            variation=variation,
        )
