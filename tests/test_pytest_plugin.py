"""The pytest plugin (``pytest11`` entry point) run by pytester on real
torch training steps: passing and failing steps, the marker and the fixture,
the header, the off switches, and no torch import at pytest start-up.

Every inner run is a subprocess: in-process pytester drops the modules a run
imported, and torch cannot import some of its own modules twice."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TRAINING = """
import numpy as np
import pytest
import torch


def train_step():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.randn(32, 8)
    loss = model(inputs).square().mean()
    loss.backward()
    optimizer.step()
    return model


def unseeded_step():
    rng = np.random.default_rng()  # OS entropy: np.random.seed does not reach it
    batch = torch.from_numpy(rng.standard_normal((32, 8)).astype(np.float32))
    model = torch.nn.Linear(8, 1)
    model(batch).pow(2).mean().backward()
    return model
"""


@pytest.fixture
def training(pytester):
    pytester.makepyfile(training_steps=TRAINING)
    return pytester


def test_marker_and_fixture_pass_on_a_reproducible_step(training):
    training.makepyfile(
        test_steps="""
        import pytest
        import torch
        from training_steps import train_step


        @pytest.mark.deterministic
        def test_body_is_the_step():
            model = train_step()
            assert model[0].weight.grad is not None


        @pytest.fixture
        def model():
            return torch.nn.Linear(4, 1)


        @pytest.mark.deterministic(repeats=4)
        def test_a_fixture_model_is_reset_between_repeats(model):
            # trains the fixture's model in place: each repeat must start from the same weights
            optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
            model(torch.randn(16, 4)).square().mean().backward()
            optimizer.step()


        def test_fixture(deterministic):
            report = deterministic(train_step)
            assert report.deterministic and report.traced_ops > 10
        """
    )
    result = training.runpytest_subprocess("-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "detaudit: deterministic steps run 3x under one seed, compared op by op (--no-detaudit to skip)",
            "*detaudit: 3 step(s) checked for bitwise reproducibility",
        ]
    )


def test_an_unseeded_generator_fails_with_the_report(training):
    training.makepyfile(
        test_steps="""
        import pytest
        from training_steps import unseeded_step


        @pytest.mark.deterministic
        def test_unseeded():
            unseeded_step()


        def test_unseeded_through_the_fixture(deterministic):
            deterministic(unseeded_step, repeats=2)
        """
    )
    result = training.runpytest_subprocess()
    result.assert_outcomes(failed=2)
    output = result.stdout.str()
    assert "nondeterministic: 3 runs of test_unseeded differ" in output
    assert "training_steps.py" in output  # the report names the source line of the differing op
    result.stdout.fnmatch_lines(["*detaudit: 2 step(s) checked for bitwise reproducibility, 2 differed"])


def test_a_cpu_nondeterministic_op_fails(training):
    training.makepyfile(
        test_race="""
        import pytest
        import torch


        @pytest.mark.deterministic(repeats=4)
        def test_embedding_backward():
            torch.set_num_threads(2)  # index_put_ accumulates duplicates in a racy order on 2 threads
            table = torch.nn.Parameter(torch.randn(8, 8))
            token_ids = torch.randint(0, 8, (400_000,))
            (table[token_ids] * torch.randn(400_000, 8)).sum().backward()


        @pytest.mark.deterministic(repeats=3, deterministic=True)
        def test_deterministic_mode_fixes_it():
            torch.set_num_threads(2)
            table = torch.nn.Parameter(torch.randn(8, 8))
            token_ids = torch.randint(0, 8, (400_000,))
            (table[token_ids] * torch.randn(400_000, 8)).sum().backward()
        """
    )
    result = training.runpytest_subprocess()
    result.assert_outcomes(failed=1, passed=1)
    assert "aten.index_put" in result.stdout.str()


def test_off_switches(training):
    training.makepyfile(
        test_steps="""
        import pytest
        from training_steps import unseeded_step


        @pytest.mark.deterministic
        def test_unseeded():
            unseeded_step()


        def test_fixture_runs_the_step_once(deterministic):
            calls = []
            assert deterministic(lambda: calls.append(unseeded_step())) is None
            assert len(calls) == 1
        """
    )
    result = training.runpytest_subprocess("--no-detaudit")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["detaudit: off (--no-detaudit): deterministic steps run once, unchecked"])
    assert "step(s) checked" not in result.stdout.str()

    unloaded = training.runpytest_subprocess("-p", "no:detaudit", "-k", "test_unseeded")
    unloaded.assert_outcomes(passed=1)  # the marker is an unknown mark now: the body runs once
    assert "detaudit:" not in unloaded.stdout.str()


def test_repeats_from_the_ini_file_and_bad_marker_arguments(training):
    training.makeini("[pytest]\ndetaudit_repeats = 2\n")
    training.makepyfile(
        test_steps="""
        import pytest
        from training_steps import train_step


        @pytest.mark.deterministic
        def test_step(deterministic):
            assert deterministic(train_step).repeats == 2


        @pytest.mark.deterministic(repeat=5)
        def test_typo():
            train_step()
        """
    )
    result = training.runpytest_subprocess()
    result.stdout.fnmatch_lines(["detaudit: deterministic steps run 2x under one seed*"])
    result.assert_outcomes(passed=1, failed=1)
    assert "takes only keyword arguments repeats, seed, deterministic, strict; got repeat" in result.stdout.str()


def test_pytest_start_up_imports_no_torch(pytester):
    """Projects without torch can have detaudit installed: loading the plugin
    (and collecting a marked test) must not import it."""
    pytester.makepyfile(
        test_plain="""
        import sys

        import pytest


        def test_torch_not_imported():
            assert "detaudit.pytest_plugin" in sys.modules
            assert "torch" not in sys.modules and "numpy" not in sys.modules


        @pytest.mark.deterministic
        def test_marked_but_collected_only():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-k", "torch_not_imported")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["detaudit: deterministic steps run 3x*"])


def test_resume_marker_and_fixture(pytester):
    """A complete checkpoint passes, one without the torch RNG state fails with the report; the marker's
    body runs only after its audit passed."""
    import shutil
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "resume" / "checkpointed_training.py"
    shutil.copy(fixture, pytester.path / "train.py")
    pytester.makepyfile(
        test_resume="""
        import pytest

        @pytest.mark.resume_equivalent("train.py", interrupt_at=4, resume_args="--resume", script_args=["--forget", "none"])
        def test_complete_checkpoint():
            print("BODY RAN")

        @pytest.mark.resume_equivalent("train.py", interrupt_at=4, resume_args="--resume", script_args=["--forget", "torch-rng"])
        def test_without_rng_state():
            print("BODY RAN")

        def test_fixture(resume_equivalent):
            report = resume_equivalent("train.py", 4, preset="plain", script_args=["--forget", "none"])
            assert report.checkpoint.endswith("checkpoint.pt")
        """
    )
    result = pytester.runpytest_subprocess("-v", "-s")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*test_complete_checkpoint BODY RAN*",
        "*diverges: train.py resumed after step 4 is not the straight run from step 5 on*",
        "*torch-rng*step 5 start*",
        "*fix: save torch.get_rng_state()*",
        "*detaudit: 3 resume(s) checked against uninterrupted runs, 1 not equivalent*",
    ])
    assert result.stdout.str().count("BODY RAN") == 1  # not the failing one's
    assert not (pytester.path / "checkpoint.pt").exists()  # the runs went to each test's tmp_path

    off = pytester.runpytest_subprocess("--no-detaudit", "-s", "-k", "not fixture")  # the bodies alone
    off.assert_outcomes(passed=2)
    assert off.stdout.str().count("BODY RAN") == 2 and "resume(s) checked" not in off.stdout.str()


def test_reference_marker_and_fixture(training, monkeypatch):
    """A missing reference fails saying how to write it; --detaudit-save-references writes it; the same
    environment then passes; another CPU capability (the other machine) fails with the drift's report,
    unless the tolerance covers it."""
    training.makepyfile(
        test_numerics="""
        import pytest
        from training_steps import train_step

        @pytest.mark.matches_reference("references/marked")
        def test_marked():
            return train_step()

        def test_fixture(matches_reference):
            matches_reference(train_step, "references/fixture")

        def test_tolerant(matches_reference):
            matches_reference(train_step, "references/fixture", tolerance="1000000000ulp")
        """
    )
    missing = training.runpytest_subprocess()
    missing.assert_outcomes(failed=3)
    missing.stdout.fnmatch_lines(["*no reference in */references/marked: write it with*--detaudit-save-references*"])
    written = training.runpytest_subprocess("--detaudit-save-references")
    written.assert_outcomes(passed=3)
    written.stdout.fnmatch_lines(["*detaudit: 3 reference(s) written*"])
    assert (training.path / "references" / "marked" / "manifest.json").is_file()
    same = training.runpytest_subprocess()
    same.assert_outcomes(passed=3)
    same.stdout.fnmatch_lines(["*detaudit: 3 step(s) compared with their references*"])
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default" if _best_capability() != "DEFAULT" else "avx2")
    other = training.runpytest_subprocess()
    if _best_capability() == "DEFAULT":
        return  # no other capability to stand for another machine
    other.assert_outcomes(passed=1, failed=2)
    other.stdout.fnmatch_lines([
        "*drift: 1 run of test_marked departed from the reference in*",
        "*training_steps.py:9 aten.randn.default: PyTorch promises no bitwise*",
        "*detaudit: 3 step(s) compared with their references, 2 drifted*",
    ])


def _best_capability() -> str:
    import subprocess
    import sys

    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    environment = {k: v for k, v in __import__("os").environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment).stdout.strip()
