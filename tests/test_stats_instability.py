"""``detaudit instability`` on the tiny real CPU training: three deterministic
runs (baseline, one ULP, reseed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detaudit.cli import main

FIXTURE = str(Path(__file__).resolve().parents[1] / "fixtures" / "stats" / "train_tiny.py")


@pytest.mark.slow
def test_one_ulp_and_reseed_distances(tmp_path, capsys):
    out = tmp_path / "probe"
    assert main(["instability", FIXTURE, "--threads", "1", "--jobs", "3", "--out", str(out), "--", "--steps", "12"]) == 0
    printed = capsys.readouterr().out
    assert "distance from the baseline run" in printed

    report = json.loads((out / "instability.json").read_text())
    runs = report["runs"]
    assert [runs[v]["seed"] for v in ("baseline", "one ULP", "reseed")] == [0, 0, 1]
    perturbed = runs["one ULP"]["perturbed"]
    assert perturbed["param"] and perturbed["old"] != perturbed["new"]  # moved by one ULP, before step 1
    assert len(runs["baseline"]["history"]["train_loss"]) == 12  # '-- --steps 12' reached the script

    ulp, reseed = report["one_ulp_vs_baseline"], report["reseed_vs_baseline"]
    # the nudged weight survives training, but 12 steps do not amplify it to a reseed's distance
    assert 0.0 < ulp["parameter_relative_l2"] < reseed["parameter_relative_l2"]
    assert reseed["first_differing_step"]["train_loss"] == 0  # other seed: other init and batches
    assert reseed["disagreement"]["test"] > 0.0 and reseed["correlation"]["test"] < 1.0
    assert 0.0 <= ulp["disagreement"]["test"] <= reseed["disagreement"]["test"]
    assert report["one_ulp_share_of_reseed_distance"] < 0.5
    assert report["conclusion"].startswith("stable to one ULP")


def test_bad_input_is_one_line_error(tmp_path, capsys):
    assert main(["instability", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert main(["instability", FIXTURE, "--seed", "3", "--reseed", "3"]) == 2
    assert "--reseed must differ" in capsys.readouterr().err
