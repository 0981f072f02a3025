"""Study folders (plan, shards, resume, merge, tables) and metric logging,
without running any training."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pytest
import torch

from detaudit.cli import main
from detaudit.stats import metrics
from detaudit.stats.study import (
    FIXED,
    VARIED,
    RunRecord,
    Study,
    StudyError,
    StudySettings,
    merge,
    parse_shard,
    plan,
    shard_of,
)

REPO = Path(__file__).resolve().parents[1]
SETTINGS = StudySettings(script="/abs/train.py", script_args=("--lr", "0.1"), runs=3, seed=5)


def record(arm, index, value, status="ok"):
    seed = SETTINGS.seed + (index if arm == VARIED else 0)
    return RunRecord(arm, index, seed, status, metrics={"acc": value} if status == "ok" else {})


def test_plan_fixes_one_seed_and_varies_the_other_arm():
    runs = plan(SETTINGS)
    assert [(r.arm, r.seed) for r in runs] == [
        (FIXED, 5), (VARIED, 5), (FIXED, 5), (VARIED, 6), (FIXED, 5), (VARIED, 7),
    ]
    assert len({r.run_id for r in runs}) == 6


def test_shards_partition_the_plan():
    runs = plan(SETTINGS)
    shards = [shard_of(runs, (i, 4)) for i in range(1, 5)]
    assert sorted(r.run_id for shard in shards for r in shard) == sorted(r.run_id for r in runs)
    assert all(shards)  # every shard has work; round-robin mixes both arms
    assert shard_of(runs, None) == runs


@pytest.mark.parametrize("text", ["3", "0/2", "3/2", "a/b", "1/0"])
def test_bad_shard_is_a_clear_error(text):
    with pytest.raises(StudyError, match="shard"):
        parse_shard(text)


def test_resume_skips_finished_runs_and_retries_failed_ones(tmp_path):
    study = Study.open(tmp_path, SETTINGS)
    study.append(record(FIXED, 0, 0.5))
    study.append(record(VARIED, 0, 0.5, status="failed"))
    with open(tmp_path / "runs.jsonl", "a") as stream:
        stream.write('{"arm": "fixed", "index": 1, "se')  # torn by a kill mid-write
    resumed = Study.open(tmp_path, SETTINGS)
    assert [r.run_id for r in resumed.pending()] == ["varied-000", "fixed-001", "varied-001", "fixed-002", "varied-002"]
    resumed.append(record(VARIED, 0, 0.7))
    assert resumed.records()["varied-000"].ok


def test_other_settings_in_the_same_folder_are_refused(tmp_path):
    Study.open(tmp_path, SETTINGS)
    with pytest.raises(StudyError, match="runs 3 -> 4"):
        Study.open(tmp_path, StudySettings(**{**SETTINGS.to_dict(), "runs": 4, "script_args": ("--lr", "0.1")}))
    with pytest.raises(StudyError, match="not a variance study"):
        Study.load(tmp_path / "elsewhere")


def test_merge_joins_shards_from_two_machines(tmp_path):
    first, second = Study.open(tmp_path / "a", SETTINGS), Study.open(tmp_path / "b", SETTINGS)
    for run in shard_of(plan(SETTINGS), (1, 2)):
        first.append(record(run.arm, run.index, 1.0 + run.index), shard=(1, 2))
        (first.run_folder(run)).mkdir(parents=True)
        (first.run_folder(run) / "metrics.jsonl").write_text("{}\n")
    for run in shard_of(plan(SETTINGS), (2, 2)):
        second.append(record(run.arm, run.index, 2.0 + run.index), shard=(2, 2))
    merged = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "all")
    assert merged.pending() == []
    assert len(merged.records()) == 6
    assert (tmp_path / "all" / "runs" / "fixed-000" / "metrics.jsonl").is_file()
    other = Study.open(tmp_path / "c", StudySettings(script="/abs/other.py"))
    assert other.settings != SETTINGS
    with pytest.raises(StudyError, match="different studies"):
        merge([tmp_path / "a", tmp_path / "c"], tmp_path / "x")


def test_tables_hold_every_run(tmp_path):
    study = Study.open(tmp_path, SETTINGS)
    study.append(RunRecord(FIXED, 0, 5, "ok", metrics={"acc": 0.5}, environment={"torch.version": "2.13.0"}))
    study.append(record(VARIED, 1, 0.25))
    study.write_tables()
    rows = list(csv.DictReader(open(tmp_path / "runs.csv")))
    assert [(r["arm"], r["seed"], r["acc"], r["environment.torch.version"]) for r in rows] == [
        ("fixed", "5", "0.5", "2.13.0"),
        ("varied", "6", "0.25", ""),
    ]
    saved = json.loads((tmp_path / "runs.json").read_text())
    assert saved["settings"]["script_args"] == ["--lr", "0.1"] and len(saved["runs"]) == 2


def test_merge_command_reports_the_joined_study(tmp_path, capsys):
    study = Study.open(tmp_path / "shard", SETTINGS)
    for run in plan(SETTINGS):
        study.append(record(run.arm, run.index, 90.0 if run.arm == FIXED else 90.0 + run.index))
    assert main(["variance", "--merge", str(tmp_path / "shard"), "--out", str(tmp_path / "all")]) == 0
    out = capsys.readouterr().out
    assert "all 3 fixed-seed runs gave exactly 90.0" in out
    summary = json.loads((tmp_path / "all" / "summary.json").read_text())
    assert summary["metrics"][0]["fixed"]["std"] == 0.0
    assert summary["metrics"][0]["varied"]["std"] == 1.0  # 90, 91, 92
    svgs = re.findall(r"<svg.*?</svg>", (tmp_path / "all" / "report.html").read_text(), re.S)
    assert len(svgs) == 1
    plot = ElementTree.fromstring(svgs[0])  # well-formed: browsers render it inline
    assert len(plot.findall("{http://www.w3.org/2000/svg}circle")) == 6  # one dot per run


def test_log_metric_is_a_no_op_outside_detaudit(monkeypatch, tmp_path):
    monkeypatch.delenv(metrics.STATS_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    metrics.log_metric("acc", 0.5)
    metrics.log_predictions("test", torch.zeros(3))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        metrics.log_metric("", 1.0)


def test_logged_values_and_stdout_lines_are_read_back(monkeypatch, tmp_path):
    monkeypatch.setenv(metrics.STATS_DIR_ENV, str(tmp_path))
    loss = torch.tensor(0.25, requires_grad=True) * 2
    metrics.log_metric("loss", loss, step=0)
    metrics.log_metric("loss", torch.tensor(0.125), step=1)
    metrics.log_predictions("test set", torch.eye(3, requires_grad=True))
    stdout = "\n".join(
        [
            "epoch 1 done",
            'detaudit-metric: {"name": "acc", "value": 91.5}',
            'detaudit-metric: {"top5": 99.0, "ece": 0.03, "step": 7}',
            "detaudit-metric: not json",
        ]
    )
    outputs = metrics.read_run_outputs(tmp_path, stdout)
    assert outputs.final == {"loss": 0.125, "acc": 91.5, "top5": 99.0, "ece": 0.03}
    assert outputs.history == {"loss": {0: 0.5, 1: 0.125}, "top5": {7: 99.0}, "ece": {7: 0.03}}
    assert np.array_equal(np.load(outputs.predictions["test_set"]), np.eye(3))
    assert len(outputs.problems) == 1 and "not json" in outputs.problems[0]


def test_metric_helpers_and_stats_cli_modules_stay_light():
    # a user script's `detaudit.log_metric` and building the stats parsers import neither torch nor numpy
    code = (
        "import sys, detaudit, detaudit.cli.variance, detaudit.cli.compare, detaudit.cli.instability\n"
        "detaudit.log_metric('acc', 0.5)\n"
        "heavy = [name for name in ('torch', 'numpy') if name in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env={
        key: value for key, value in os.environ.items() if key != metrics.STATS_DIR_ENV
    })
    assert result.returncode == 0, result.stderr
