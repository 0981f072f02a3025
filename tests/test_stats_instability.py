"""``detaudit instability`` on the tiny real CPU training: three deterministic
runs (baseline, one ULP, reseed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detaudit.cli import main
from detaudit.stats.instability import Divergence, ProbeReport

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
    assert report["verdict_measure"] == "disagreement on predictions 'test'"
    assert report["one_ulp_share_of_reseed"] < 0.01
    assert report["conclusion"].startswith("stable to one ULP at this length")


def test_bad_input_is_one_line_error(tmp_path, capsys):
    assert main(["instability", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    assert main(["instability", FIXTURE, "--seed", "3", "--reseed", "3"]) == 2
    assert "--reseed must differ" in capsys.readouterr().err


@pytest.mark.parametrize(
    "ulp, reseed, verdict",
    [(0.10, 0.11, "UNSTABLE"), (0.03, 0.30, "partly unstable"), (0.0, 0.30, "stable to one ULP")],
)
def test_verdict_rests_on_prediction_disagreement(ulp, reseed, verdict):
    # the weights of the one-ULP run are far closer than a reseed's, but its predictions decide
    report = ProbeReport(
        runs={},
        ulp=Divergence(parameter_distance=1e-3, disagreement={"test": ulp}),
        reseed=Divergence(parameter_distance=1.4, disagreement={"test": reseed}),
    )
    assert report.conclusion().startswith(verdict)
    assert report.ulp_share == pytest.approx(ulp / reseed)


def test_verdict_without_predictions_uses_weights():
    report = ProbeReport(runs={}, ulp=Divergence(parameter_distance=0.9), reseed=Divergence(parameter_distance=1.2))
    assert report.measure[0] == "relative L2 distance of the final weights"
    assert report.conclusion().startswith("UNSTABLE")
    untouched = ProbeReport(runs={}, ulp=Divergence(parameter_distance=0.0), reseed=Divergence(parameter_distance=1.2))
    assert untouched.conclusion().startswith("the one-ULP change left no trace")
