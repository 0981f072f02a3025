"""enable_determinism / deterministic against torch's real state."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._inductor.config  # noqa: F401  torch.use_deterministic_algorithms imports it anyway;
# importing it first keeps the fingerprint's keys the same before and after

import detaudit
from detaudit.runtime.determinism import tf32_switches
from detaudit.runtime.environment import fingerprint, version_tuple

REPO = Path(__file__).resolve().parents[1]
TINY_TRAINING = REPO / "fixtures" / "runtime" / "tiny_training.py"


def process_state() -> dict:
    """Every setting plus the RNG states: what 'restores everything' compares."""
    state = fingerprint()
    state["rng.python"] = random.getstate()
    state["rng.numpy"] = repr(np.random.get_state())
    state["rng.torch"] = torch.get_rng_state().tolist()
    return state


def run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )


def inductor_deterministic() -> bool:
    config = sys.modules.get("torch._inductor.config")
    return config.deterministic if config else os.environ.get("TORCHINDUCTOR_DETERMINISTIC") == "1"


def assert_deterministic_mode(warn_only: bool) -> None:
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    assert torch.backends.cudnn.rnn.fp32_precision == "ieee"
    assert torch.utils.deterministic.fill_uninitialized_memory
    assert inductor_deterministic()


def test_enable_determinism_sets_everything_and_restores():
    before = process_state()
    changes = detaudit.enable_determinism()
    try:
        assert_deterministic_mode(warn_only=False)
        changed = {change.name for change in changes.changes}
        assert {"torch.use_deterministic_algorithms", "torch.backends.cudnn.conv.fp32_precision"} <= changed
        assert "CUBLAS_WORKSPACE_CONFIG: not needed" in str(changes)  # CPU torch 2.13
    finally:
        changes.restore()
    assert process_state() == before
    changes.restore()  # a second restore changes nothing
    assert process_state() == before


def test_strict_mode_raises_and_lenient_mode_warns_on_a_nondeterministic_op():
    def put_twice():  # put_ with accumulate=False has no deterministic kernel on any device
        torch.zeros(3).put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))

    with detaudit.deterministic():
        with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            put_twice()
    with detaudit.deterministic(strict=False) as changes:
        assert_deterministic_mode(warn_only=True)
        by_name = {change.name: change.after for change in changes.changes}
        assert by_name["torch.use_deterministic_algorithms"] == (True, True)
        with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
            put_twice()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        put_twice()  # determinism is off again


@pytest.mark.filterwarnings("ignore::detaudit.runtime.DeterminismWarning")  # this interpreter's hash seed
def test_context_manager_seeds_and_restores_settings_and_rngs():
    before = process_state()
    with detaudit.deterministic(seed=5):
        assert_deterministic_mode(warn_only=False)
        inside = (random.random(), np.random.rand(), torch.rand(2).tolist())
    assert process_state() == before
    detaudit.seed_everything(5)
    assert (random.random(), np.random.rand(), torch.rand(2).tolist()) == inside


@pytest.mark.filterwarnings("ignore::detaudit.runtime.DeterminismWarning")
def test_decorator_restores_even_when_the_function_raises():
    before = process_state()

    @detaudit.deterministic(seed=1)
    def fails():
        assert torch.are_deterministic_algorithms_enabled()
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fails()
    assert process_state() == before
    with pytest.raises(KeyError):
        fails()  # one decorator instance, used again
    assert process_state() == before


def test_nested_use_of_one_instance_restores_each_level():
    guard = detaudit.deterministic()
    before = process_state()
    with guard:
        torch.backends.cudnn.benchmark = True  # user code changes a flag inside
        with guard:
            assert not torch.backends.cudnn.benchmark
        assert torch.backends.cudnn.benchmark  # inner exit put back the inner entry state
    assert process_state() == before


# Checks that need an interpreter of their own (torch remembers which TF32 API
# was used, and its legacy getters raise or not accordingly; inductor must not
# be imported yet).  They share one subprocess to keep this file fast.
FRESH_INTERPRETER_CHECKS = """
import json, os, torch, detaudit
from detaudit.runtime.determinism import DeterminismChanges, tf32_switches
from detaudit.runtime.environment import fingerprint
results = {}

# inductor is not imported yet: its switch is TORCHINDUCTOR_DETERMINISTIC
with detaudit.deterministic():
    import torch._inductor.config as config
    inside = config.deterministic
results["inductor"] = [inside, config.deterministic, os.environ.get("TORCHINDUCTOR_DETERMINISTIC")]

# the legacy-flag path torch < 2.9 takes; the legacy setters still work here
torch.set_float32_matmul_precision("medium")
changes = DeterminismChanges()
for switch in tf32_switches(torch, use_fp32_precision_api=False):
    changes.apply(switch)
during = [torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
          torch.backends.cudnn.allow_tf32, [c.name for c in changes.changes]]
changes.restore()
results["legacy"] = [during, [torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32]]

# restore from starting states set through either TF32 API (cumulative)
for label, setup in [
    ("legacy cudnn", "torch.backends.cudnn.allow_tf32 = False"),
    ("legacy matmul + benchmark", "torch.set_float32_matmul_precision('high'); torch.backends.cudnn.benchmark = True"),
    ("new matmul", "torch.backends.cuda.matmul.fp32_precision = 'tf32'"),
    ("new generic + warn_only", "torch.backends.fp32_precision = 'tf32'; torch.use_deterministic_algorithms(True, warn_only=True)"),
]:
    exec(setup)
    before = fingerprint()
    with detaudit.deterministic(seed=3):
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    after = fingerprint()
    results[label] = {k: [before[k], after.get(k)] for k in before if before[k] != after.get(k)}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def fresh_interpreter_results() -> dict:
    done = run_python(FRESH_INTERPRETER_CHECKS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "starting_state", ["legacy cudnn", "legacy matmul + benchmark", "new matmul", "new generic + warn_only"]
)
def test_restores_any_tf32_api_state_exactly(fresh_interpreter_results, starting_state):
    assert fresh_interpreter_results[starting_state] == {}  # no setting differs


def test_legacy_tf32_flags_path_on_real_torch(fresh_interpreter_results):
    during, after = fresh_interpreter_results["legacy"]
    assert during == [
        "highest", False, False, ["torch.set_float32_matmul_precision", "torch.backends.cudnn.allow_tf32"]
    ]
    assert after == ["medium", True]


def test_inductor_imported_inside_the_block_is_reset_on_exit(fresh_interpreter_results):
    inside, after, variable = fresh_interpreter_results["inductor"]
    assert (inside, after, variable) == (True, False, None)


def test_bad_seed_is_refused_before_anything_changes():
    before = process_state()
    with pytest.raises(ValueError, match="seed must be"):
        detaudit.deterministic(seed=-3)
    assert process_state() == before


def test_version_parsing():
    assert version_tuple("2.9.0a0+git1234") == (2, 9)
    assert version_tuple("2.13.0+cpu") == (2, 13)
    assert version_tuple(torch.__version__) >= (2, 4)


def test_tf32_switches_cover_only_leaf_namespaces():
    names = [switch.name for switch in tf32_switches(torch, use_fp32_precision_api=True)]
    assert "torch.backends.cudnn.conv.fp32_precision" in names
    assert "torch.backends.fp32_precision" not in names  # a parent would overwrite its children


def test_two_processes_train_bit_identically():
    """The issue's "done when": a CPU training run under deterministic(seed=0),
    in two separate processes, saves bit-identical parameters."""
    outputs = []
    for run in range(2):
        out = REPO / "fixtures" / "runtime" / f".run{run}.pt"
        outputs.append(out)
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            [sys.executable, str(TINY_TRAINING), str(out)], capture_output=True, text=True, env=env, timeout=180
        )
        assert done.returncode == 0, done.stderr
    try:
        first, second = (torch.load(path) for path in outputs)
        assert first.keys() == second.keys()
        for name in first:
            assert first[name].numpy().tobytes() == second[name].numpy().tobytes(), name
    finally:
        for path in outputs:
            path.unlink(missing_ok=True)


@pytest.mark.cuda
def test_cuda_flags_and_cublas_config_on_a_gpu():
    torch.zeros(1, device="cuda")
    with detaudit.deterministic(seed=0) as changes:
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        x = torch.randn(64, 64, device="cuda")
        assert torch.equal(x @ x, x @ x)
        if version_tuple(torch.__version__) >= (2, 10):
            assert "CUBLAS_WORKSPACE_CONFIG: not needed" in str(changes)
        else:
            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
