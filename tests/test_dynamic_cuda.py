"""GPU checks of the dynamic pass (skipped without CUDA; see tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detaudit.cli import main

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dynamic" / "cuda_index_add.py"


@pytest.mark.cuda
def test_index_add_is_caught_and_localized(capsys):
    code = main(["run", str(FIXTURE), "--repeats", "3", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    ops = {(c["kind"], c["op"].split(".")[1], c["line"]) for c in report["root_causes"]}
    assert ("nondeterministic-op", "index_add_", 17) in ops


@pytest.mark.cuda
def test_deterministic_settings_make_it_deterministic(capsys):
    code = main(["run", str(FIXTURE), "--repeats", "3", "--deterministic", "--format", "json"])
    assert code == 0, capsys.readouterr().out
