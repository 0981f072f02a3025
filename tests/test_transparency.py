"""detaudit never changes what a script can do: each script under
fixtures/dynamic/transparency/ exercises APIs training stacks use on storages
and prints its results; traced (by either recorder, with the allocation fill
the final state and run 1's online capture on, as ``detaudit run`` traces) it prints the same as run
plainly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from detaudit.dynamic.record.features import SaveFinalState, Tracing
from detaudit.launch.options import LaunchOptions
from detaudit.launch.process import run_script

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "dynamic" / "transparency").glob("*.py"))


def _results(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("results:"))


@pytest.mark.parametrize("native", ["1", "0"], ids=["compiled-recorder", "python-recorder"])
@pytest.mark.parametrize("script", SCRIPTS, ids=[script.stem for script in SCRIPTS])
def test_a_script_prints_the_same_traced_as_plain(script, native, tmp_path):
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    traced = run_script(
        script,
        options=LaunchOptions(
            seed=0, output_dir=tmp_path / "run", extra_env={"DETAUDIT_NATIVE": native},
            features=(Tracing(allocation_fill=1, keep_first_steps=True), SaveFinalState()),
        ),
        timeout=300,
        cwd=tmp_path,
    )
    assert traced.returncode == 0, traced.describe_failure()
    assert traced.payload["steps"] >= 2 and traced.payload.get("trace_file")
    assert _results(traced.stdout) == _results(plain.stdout)
