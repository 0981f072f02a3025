"""detaudit resume: the verdict and the first component that differs, each
case checked first by plain runs of the fixture (straight against stopped and
resumed, the losses it prints)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from detaudit.cli import main
import detaudit
from detaudit.resume.audit import audit_resume
from detaudit.resume.components import COMPONENTS

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "resume" / "checkpointed_training.py"
SCHEMA = json.loads((Path(detaudit.__file__).parent / "resume" / "report.schema.json").read_text())
STEPS = 8


def _losses(cwd: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(FIXTURE), "--steps", str(STEPS), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def plain_resume_is_equivalent(cwd: Path, interrupt_at: int, options: list[str]) -> bool:
    """The ground truth: a plain run stopped after ``interrupt_at`` steps and
    resumed prints the straight run's losses from there on."""
    straight = _losses(cwd, *options)
    _losses(cwd, *options, "--steps", str(interrupt_at))
    resumed = _losses(cwd, *options, "--resume")
    return resumed == straight[interrupt_at:]


CASES = [
    # (what the checkpoint forgets, K, DataLoader workers, the first component that differs; None: equivalent)
    ("none", 4, 0, None),
    ("none", 4, 2, None),
    ("torch-rng", 4, 0, "torch-rng"),
    ("scheduler", 4, 0, "scheduler"),
    ("epoch-position", 3, 0, "batch"),
    # the loader's generator: the next epoch's iterator seeds its workers from it (their jitter: the batch)
    ("loader-rng", 4, 2, "batch"),
    # a complete checkpoint resumed mid-epoch: skipping the seen batches by fetching them draws their augmentation
    ("none", 3, 0, "torch-rng"),
]


@pytest.mark.parametrize("forget, interrupt_at, workers, first", CASES, ids=[f"{c[0]}-k{c[1]}-w{c[2]}" for c in CASES])
def test_the_verdict_and_the_first_component_are_those_plain_runs_show(tmp_path, forget, interrupt_at, workers, first):
    options = ["--forget", forget, "--workers", str(workers)]
    assert plain_resume_is_equivalent(tmp_path, interrupt_at, options) == (first is None)
    (tmp_path / "checkpoint.pt").unlink()

    report = audit_resume(FIXTURE, interrupt_at, "--resume", steps=STEPS, script_args=options, cwd=tmp_path, timeout=300)
    assert report.error == ""
    jsonschema.validate(report.to_json(), SCHEMA)
    assert report.compared_steps == list(range(interrupt_at + 1, STEPS + 1))
    assert [call["line"] for call in report.saved_at] == [_line_of("torch.save(")]
    assert _line_of("torch.load(") in [call["line"] for call in report.loaded_at]
    lines = FIXTURE.read_text().splitlines()
    assert all("load" in lines[call["line"] - 1] for call in report.loaded_at), "detaudit's own load was listed"
    if first is None:
        assert (report.verdict, report.exit_code, report.differences) == ("equivalent", 0, [])
        return
    assert (report.verdict, report.exit_code) == ("diverges", 1)
    assert report.differences[0].component == first
    assert report.differences[0].step == interrupt_at + 1 and report.differences[0].at == "start"
    components = [difference.component for difference in report.differences]
    assert len(set(components)) == len(components) and "parameters" in components
    if forget == "torch-rng":
        # the first op after the resume that draws from the torch generator: the dropout's mask
        read_by = report.differences[0].read_by
        assert read_by["module"] == "model.2" and read_by["line"] == _line_of("model(inputs)"), read_by
        assert read_by["op"] in ("aten::bernoulli_", "aten::native_dropout")
        assert report.to_json()["differences"][0]["read_by"] == read_by
    if forget == "loader-rng":
        generator = report.differences[1]
        assert (generator.component, generator.names, generator.downstream) == ("generator", ["loader_generator"], False)


def _line_of(text: str) -> int:
    return next(number for number, line in enumerate(FIXTURE.read_text().splitlines(), 1) if text in line)


def test_the_json_report_names_the_difference_its_fix_and_the_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["resume", str(FIXTURE), "--interrupt-at", "4", "--resume-args=--resume", "--format", "json",
                 "--", "--forget", "scheduler"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 == report["exit_code"] and report["verdict"] == "diverges"
    assert (report["interrupt_at"], report["steps"]) == (4, 8)
    first = report["differences"][0]
    assert (first["component"], first["step"], first["name"]) == ("scheduler", 5, "scheduler[0] (LambdaLR)")
    assert first["fix"] == COMPONENTS["scheduler"].fix and "restarted" in first["message"]
    assert first["line"] == _line_of("torch.save(")
    assert {call["call"] for call in report["checkpoint"]["loaded_at"]} == {"torch.load", "load_state_dict"}
    assert report["environment"] and report["error"] is None


def test_resume_arguments_that_load_nothing_are_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["resume", str(FIXTURE), "--interrupt-at", "2", "--resume-args=--forget none"])
    out = capsys.readouterr().out
    assert code == 2 and "loaded no checkpoint" in out and "had no effect" in out
    code = main(["resume", str(FIXTURE), "--interrupt-at", "2", "--resume-args=--forget none", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, SCHEMA)
    assert (code, report["verdict"], report["exit_code"]) == (2, "error", 2) and "had no effect" in report["error"]


def test_the_report_schema_names_every_component():
    names = SCHEMA["properties"]["differences"]["items"]["properties"]["component"]["enum"]
    assert names == list(COMPONENTS)


def test_a_resumed_run_that_crashes_is_reported_with_its_output(tmp_path):
    # --resume with {step} as a checkpoint file that does not exist
    report = audit_resume(FIXTURE, 2, "--resume --checkpoint missing-{step}.pt", cwd=tmp_path, timeout=120)
    assert (report.verdict, report.exit_code) == ("error", 2)
    assert report.error.startswith("the resumed run of the script exited with code 1")
    assert "missing-2.pt" in report.error  # the script's own traceback


def test_an_interruption_after_the_last_step_is_an_error(tmp_path):
    assert detaudit.audit_resume is audit_resume  # the public name
    report = audit_resume(FIXTURE, 9, "--resume", steps=10, script_args=["--steps", "8"], cwd=tmp_path, timeout=120)
    assert report.exit_code == 2 and "made 8 optimizer steps, fewer than --interrupt-at 9" in report.error


def test_sarif_and_github_output_carry_one_finding_per_component(capsys):
    from detaudit.cli.resume import _write
    from detaudit.resume.compare import differences
    from detaudit.resume.report import ResumeReport

    straight = [{"at": "start", "step": 3, "digests": {"scheduler": {"s": 1}, "parameters": {"w": 1}}},
                {"at": "end", "step": 3, "digests": {"parameters": {"w": 2}}}]
    resumed = [{"at": "start", "step": 1, "digests": {"scheduler": {"s": 9}, "parameters": {"w": 1}}},
               {"at": "end", "step": 1, "digests": {"parameters": {"w": 7}}}]
    report = ResumeReport("train.py", 2, 4, "diverges", differences(straight, resumed, 2),
                          [{"call": "torch.save", "path": "train.py", "line": 40, "run": "interrupted"}])
    assert [(d.component, d.step, d.at, d.downstream) for d in report.differences] == [
        ("scheduler", 3, "start", False), ("parameters", 3, "end", True)]

    _write(report, "sarif")
    sarif = json.loads(capsys.readouterr().out)
    results = sarif["runs"][0]["results"]
    assert [(r["ruleId"], r["level"]) for r in results] == [
        (COMPONENTS["scheduler"].code, "error"), (COMPONENTS["parameters"].code, "note")]
    assert results[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 40
    assert {rule["id"] for rule in sarif["runs"][0]["tool"]["driver"]["rules"]} == {r["ruleId"] for r in results}

    _write(report, "github")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("::error file=train.py,line=40,title=RES") and "scheduler" in lines[0]
    assert lines[1].startswith("::notice ") and lines[-1].startswith("diverges:")
