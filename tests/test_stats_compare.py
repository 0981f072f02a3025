"""``detaudit compare`` on per-seed results: the issue's five-seed example,
a real difference, unpaired seeds, variance folders and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from detaudit.cli import main
from detaudit.stats.compare import compare_metric, load_per_seed
from detaudit.stats.study import VARIED, RunRecord, Study, StudySettings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stats"
MODEL_A, MODEL_B = str(FIXTURES / "model_a.csv"), str(FIXTURES / "model_b.csv")


def write_csv(path: Path, rows: list[tuple]) -> str:
    path.write_text("seed,test_acc\n" + "".join(f"{seed},{value}\n" for seed, value in rows))
    return str(path)


def test_issue_example_is_not_distinguishable(capsys):
    a, b = load_per_seed(Path(MODEL_A))["test_acc"], load_per_seed(Path(MODEL_B))["test_acc"]
    assert max(b[s] - a[s] for s in a) == pytest.approx(0.6)  # B wins seed 4 by 0.6 points
    assert main(["compare", MODEL_A, MODEL_B]) == 0
    out = capsys.readouterr().out
    assert "B is better than A by 0.02 ±" in out
    assert "not distinguishable from seed noise" in out
    assert "B beats A on a random pair of seeds with probability 0.54" in out  # 13.5 of 25 pairs
    # sd of the differences 0.497, d = 0.04: a paired t-test needs thousands of seeds
    assert "seeds: about 4,900 seeds would make a difference of 0.02 distinguishable from seed noise" in out


def test_issue_example_as_json(capsys):
    assert main(["compare", MODEL_A, MODEL_B, "--metric", "test_acc", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["paired"] is True and result["paired_seeds"] == ["1", "2", "3", "4", "5"]
    assert result["difference_b_minus_a"] == pytest.approx(0.02)
    assert result["a"]["mean"] == pytest.approx(90.16) and result["b"]["mean"] == pytest.approx(90.18)
    assert result["ci95"][0] < 0 < result["ci95"][1]
    assert result["distinguishable"] is False
    # IQM of 5 seeds: the middle 3 (trim_mean cuts one at each end)
    assert result["iqm"]["a"] == pytest.approx((90.4 + 89.9 + 90.2) / 3)
    assert result["iqm"]["b"] == pytest.approx((90.0 + 90.3 + 90.1) / 3)
    assert result["iqm"]["a_ci95"][0] <= result["iqm"]["a"] <= result["iqm"]["a_ci95"][1]
    assert result["probability_of_improvement"] == pytest.approx(13.5 / 25)
    low, high = result["probability_of_improvement_ci95"]
    assert low < 0.5 < high
    needed = result["seeds_needed"]
    assert needed["test"] == "paired t-test" and needed["alpha"] == 0.05 and needed["power"] == 0.8
    assert 4000 < needed["seeds"] < 6000 and needed["seeds_run"] == 5


def test_a_consistent_gain_is_larger_than_seed_noise(tmp_path, capsys):
    a = write_csv(tmp_path / "a.csv", [(1, 90.5), (2, 89.8), (3, 90.4), (4, 89.9), (5, 90.2)])
    b = write_csv(tmp_path / "b.csv", [(1, 91.5), (2, 90.9), (3, 91.3), (4, 91.0), (5, 91.1)])
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "B is better than A by 1 ±" in out and "larger than seed noise" in out
    assert "seeds: 3 seeds suffice to tell a difference of 1 from seed noise" in out
    assert "B beats A on a random pair of seeds with probability 1.00" in out
    assert main(["compare", a, b, "--lower-is-better"]) == 0
    assert "B is worse than A by 1 ±" in capsys.readouterr().out


def test_tasks_are_strata(tmp_path, capsys):
    # two tasks on one scale, three seeds each; B wins on task x, loses on task y
    rows = "task,seed,score\n" + "".join(f"{t},{s},{v}\n" for t, s, v in [
        ("x", 1, 0.50), ("x", 2, 0.52), ("x", 3, 0.51), ("y", 1, 0.80), ("y", 2, 0.82), ("y", 3, 0.81)])
    better_on_x = "task,seed,score\n" + "".join(f"{t},{s},{v}\n" for t, s, v in [
        ("x", 1, 0.60), ("x", 2, 0.62), ("x", 3, 0.61), ("y", 1, 0.70), ("y", 2, 0.72), ("y", 3, 0.71)])
    (tmp_path / "a.csv").write_text(rows)
    (tmp_path / "b.csv").write_text(better_on_x)
    assert main(["compare", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["tasks"] == ["x", "y"]
    assert result["paired_seeds"] == ["x/1", "x/2", "x/3", "y/1", "y/2", "y/3"]
    assert result["difference_b_minus_a"] == pytest.approx(0.0)
    assert result["probability_of_improvement"] == pytest.approx(0.5)  # (1 + 0) / 2 tasks
    assert result["probability_of_improvement_ci95"] == [0.5, 0.5]  # every stratified resample keeps both tasks
    (tmp_path / "dup.csv").write_text(rows + "x,1,0.4\n")
    assert main(["compare", str(tmp_path / "dup.csv"), str(tmp_path / "b.csv")]) == 2
    assert "task x seed 1 appears twice" in capsys.readouterr().err


def test_different_seeds_are_compared_unpaired():
    comparison = compare_metric(
        "acc", {("", "1"): 1.0, ("", "2"): 2.0, ("", "3"): 3.0}, {("", "4"): 4.0, ("", "5"): 6.0, ("", "6"): 8.0}
    )
    assert not comparison.paired
    assert comparison.test.name == "Welch's t-test"
    assert comparison.test.df == pytest.approx(50 / 17)  # by hand, see test_stats_numerics
    assert comparison.difference == 4.0
    assert comparison.improvement == 1.0
    assert comparison.seeds_needed.test == "Welch's t-test" and not comparison.seeds_needed.paired


def test_only_common_seeds_are_paired(tmp_path, capsys):
    a = write_csv(tmp_path / "a.csv", [(1, 1.0), (2, 2.0), (3, 3.0), (9, 50.0)])
    b = write_csv(tmp_path / "b.csv", [(1, 1.5), (2, 2.5), (3, 3.25)])
    assert main(["compare", a, b]) == 0
    assert "(1 result(s) without a matching seed ignored)" in capsys.readouterr().out
    assert main(["compare", a, b, "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["paired_seeds"] == ["1", "2", "3"] and result["difference_b_minus_a"] == pytest.approx(1.25 / 3)


def test_a_variance_study_folder_is_per_seed_input(tmp_path, capsys):
    study = Study.open(tmp_path / "study", StudySettings(script="/abs/train.py", runs=5, seed=1))
    for index, value in enumerate([90.0, 90.3, 90.1, 90.5, 90.0]):
        study.append(RunRecord(VARIED, index, 1 + index, "ok", metrics={"test_acc": value}))
        study.append(RunRecord("fixed", index, 1, "ok", metrics={"test_acc": 0.0}))  # not per-seed results
    assert load_per_seed(tmp_path / "study")["test_acc"] == {
        ("", "1"): 90.0, ("", "2"): 90.3, ("", "3"): 90.1, ("", "4"): 90.5, ("", "5"): 90.0
    }
    assert main(["compare", MODEL_A, str(tmp_path / "study"), "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["difference_b_minus_a"] == pytest.approx(0.02) and result["paired"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("run,acc\n1,0.5\n", "'seed' column"),
        ("seed,acc\n1,0.5\n1,0.6\n", "seed 1 appears twice"),
        ("seed,acc\n1,high\n", "is not a number"),
    ],
)
def test_bad_csv_is_one_line_error(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    assert main(["compare", str(bad), MODEL_B]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_inputs_and_metrics_are_usage_errors(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.csv"), MODEL_B]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["compare", MODEL_A, MODEL_B, "--metric", "loss"]) == 2
    assert "common metrics: test_acc" in capsys.readouterr().err
    single = write_csv(tmp_path / "one.csv", [(1, 90.0)])
    assert main(["compare", single, MODEL_B]) == 2
    assert "need at least 2" in capsys.readouterr().err
