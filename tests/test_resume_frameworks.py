"""detaudit resume through the presets, on tiny Lightning, transformers and
accelerate trainings (fixtures/resume/): each verdict checked first by plain
runs of the script (straight; stopped after step K as a preemption would,
the schedule still planned for N; resumed from the checkpoint that run
wrote), the losses they print."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from detaudit.resume.audit import audit_resume

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "resume"
STEPS = 8


def _losses(script: str, cwd: Path, *args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(FIXTURES / script), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith("step ")]


def plain_truth(script: str, cwd: Path, interrupt_at: int, stop: list[str], resume: list[str], fresh: list[str]) -> bool:
    """Whether the plain resumed run prints the straight run's losses from step K on
    (``fresh``: arguments that give the straight run its own checkpoint folder)."""
    straight = _losses(script, cwd, *fresh)
    assert len(straight) == STEPS
    _losses(script, cwd, *stop)
    return _losses(script, cwd, *resume) == straight[interrupt_at:]


def test_lightning_preset_resumes_through_fit_ckpt_path_and_names_the_torch_rng(tmp_path):
    pytest.importorskip("lightning")
    # an epoch of 4 batches, a checkpoint every 2 steps: Lightning's checkpoint holds no global RNG state,
    # and the next epoch's shuffle and the dropout masks draw from it
    truth = plain_truth(
        "lightning_training.py", tmp_path, 4, ["--max-steps", "4", "--dir", "stopped"],
        ["--ckpt-path", "stopped/epoch=0-step=4.ckpt", "--dir", "resumed"], ["--dir", "straight"],
    )
    assert truth is False
    report = audit_resume(FIXTURES / "lightning_training.py", 4, preset="lightning", steps=STEPS, cwd=tmp_path, timeout=300)
    assert report.error == ""
    assert report.verdict == "diverges"
    assert report.differences[0].component == "torch-rng" and report.differences[0].step == 5
    assert Path(report.checkpoint).parent == tmp_path / "lightning_checkpoints"
    assert "step=4" in Path(report.checkpoint).name
    # the checkpoint is written and read through Lightning, from the script's trainer.fit line
    assert {call["line"] for call in report.saved_at + report.loaded_at} == {_line("lightning_training.py", "trainer.fit(")}


def test_transformers_preset_resumes_through_train_resume_from_checkpoint_equivalently(tmp_path):
    pytest.importorskip("transformers")
    truth = plain_truth(
        "transformers_training.py", tmp_path, 4, ["--stop-after", "4", "--output-dir", "stopped"],
        ["--resume-from", "stopped/checkpoint-4", "--output-dir", "stopped"], ["--output-dir", "straight"],
    )
    assert truth is True
    report = audit_resume(FIXTURES / "transformers_training.py", 4, preset="transformers", steps=STEPS, cwd=tmp_path, timeout=300)
    assert report.error == ""
    assert report.verdict == "equivalent", report.text()
    assert report.compared_steps == [5, 6, 7, 8]
    assert report.checkpoint == str(tmp_path / "trainer_output" / "checkpoint-4")
    assert report.loaded_at


@pytest.mark.parametrize("interrupt_at, equivalent", [(4, True), (2, False)], ids=["epoch-end", "mid-epoch"])
def test_accelerate_script_flag_given_the_checkpoint_folder(tmp_path, interrupt_at, equivalent):
    pytest.importorskip("accelerate")
    k = str(interrupt_at)
    truth = plain_truth(
        "accelerate_training.py", tmp_path, interrupt_at, ["--stop-after", k, "--output-dir", "stopped"],
        ["--resume-from", f"stopped/step_{k}", "--output-dir", "stopped"], ["--output-dir", "straight"],
    )
    assert truth is equivalent
    report = audit_resume(
        FIXTURES / "accelerate_training.py", interrupt_at, "--resume-from {checkpoint}", steps=STEPS, cwd=tmp_path,
        timeout=300,
    )
    assert report.error == ""
    assert report.checkpoint == str(tmp_path / "accelerate_states" / f"step_{k}")
    assert report.verdict == ("equivalent" if equivalent else "diverges"), report.text()
    if not equivalent:
        # mid-epoch: the resumed iterator's shuffle draws from the restored RNG, not where the epoch's was drawn
        assert report.differences[0].component == "torch-rng"
    # the load is the script's load_state line, not prepare's reload of each optimizer (the straight run makes it too)
    assert {call["line"] for call in report.loaded_at} == {_line("accelerate_training.py", "accelerator.load_state(")}


def test_accelerate_preset_loads_the_state_as_prepare_returns(tmp_path):
    pytest.importorskip("accelerate")
    # the script is not told it resumes (its step counter starts over, which the comparison does not see):
    # the state loaded after prepare, at an epoch's end, continues as the straight run
    report = audit_resume(FIXTURES / "accelerate_training.py", 4, preset="accelerate", steps=STEPS, cwd=tmp_path, timeout=300)
    assert report.error == ""
    assert report.verdict == "equivalent", report.text()
    assert [call["line"] for call in report.loaded_at] == [_line("accelerate_training.py", "accelerator.prepare(")]


def test_plain_preset_passes_the_newest_checkpoint_file_to_resume(tmp_path):
    (tmp_path / "ckpt").mkdir()
    report = audit_resume(
        FIXTURES / "checkpointed_training.py", 4, preset="plain", steps=STEPS, script_args=["--checkpoint", "ckpt/last.pt"],
        cwd=tmp_path, timeout=300,
    )
    assert report.error == ""
    assert report.verdict == "equivalent", report.text()
    assert report.checkpoint == str(tmp_path / "ckpt" / "last.pt")
    assert report.to_json()["checkpoint"]["resumed_from"] == report.checkpoint


def test_a_checkpoint_older_than_the_interruption_is_an_error_not_a_resume(tmp_path):
    pytest.importorskip("accelerate")
    # a state saved every 3 steps: interrupted after step 4, the newest is step 3's
    report = audit_resume(
        FIXTURES / "accelerate_training.py", 4, "--resume-from {checkpoint}", steps=STEPS,
        script_args=["--every", "3"], cwd=tmp_path, timeout=300,
    )
    assert report.verdict == "error" and report.exit_code == 2
    assert "no checkpoint after step 4" in report.error and "after step 3" in report.error
    assert "--interrupt-at a multiple of M" in report.error


def _line(script: str, text: str) -> int:
    """The line of the script's code (not its docstring, which quotes code) holding ``text``."""
    lines = (FIXTURES / script).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line and "``" not in line)
