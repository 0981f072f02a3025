"""detaudit.status() and `detaudit status` on the real process state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import detaudit
from detaudit.runtime.status import diagnose

REPO = Path(__file__).resolve().parents[1]


def flagged(result) -> set[str]:
    return {issue.setting for issue in result.issues}


@pytest.mark.filterwarnings("ignore::detaudit.runtime.DeterminismWarning")
def test_status_reflects_the_live_state_and_the_helpers_clear_it():
    plain = detaudit.status()
    assert plain.settings["torch.get_num_threads"] == torch.get_num_threads()
    assert plain.settings["rng.torch.initial_seed"] == torch.initial_seed()
    assert "torch.are_deterministic_algorithms_enabled" in flagged(plain)
    with detaudit.deterministic(seed=4):
        inside = detaudit.status()
        assert inside.settings["rng.seed_everything"] == 4
        assert inside.settings["rng.torch.initial_seed"] == 4
        assert inside.settings["torch.are_deterministic_algorithms_enabled"] is True
        assert not flagged(inside) & {"torch.are_deterministic_algorithms_enabled", "rng.seed_everything"}
    with detaudit.deterministic(strict=False):
        assert "torch.is_deterministic_algorithms_warn_only_enabled" in flagged(detaudit.status())


def test_to_dict_is_json_and_text_rendering_names_the_fixes():
    result = detaudit.status()
    data = json.loads(json.dumps(result.to_dict()))
    assert data["settings"]["torch.version"] == torch.__version__
    assert {"setting", "problem", "fix"} <= set(data["nondeterministic"][0])
    text = str(result)
    assert "torch.backends.cudnn.conv.fp32_precision" in text
    assert "index_put_(accumulate) behind x[idx] backward" in text  # markup-looking text kept
    assert "detaudit.enable_determinism()" in text


def test_diagnose_a_saved_fingerprint_from_another_process():
    settings = {
        "torch.version": "2.8.0+cu128",
        "torch.version.cuda": "12.8",
        "torch.cuda.is_available": True,
        "torch.are_deterministic_algorithms_enabled": True,
        "torch.is_deterministic_algorithms_warn_only_enabled": False,
        "torch.backends.cudnn.benchmark": True,
        "torch.backends.cudnn.conv.fp32_precision": "tf32",
        "torch.get_float32_matmul_precision": "high",
        "env.CUBLAS_WORKSPACE_CONFIG": None,
        "env.PYTHONHASHSEED": "0",
        "python.hash_randomization": False,
        "rng.seed_everything": 0,
    }
    assert {issue.setting for issue in diagnose(settings)} == {
        "torch.backends.cudnn.benchmark",
        "torch.backends.cudnn.conv.fp32_precision",
        "torch.get_float32_matmul_precision",
        "env.CUBLAS_WORKSPACE_CONFIG",
    }
    newer = {**settings, "torch.version": "2.10.0+cu130", "torch.cuda.is_available": False}
    # CUBLAS_WORKSPACE_CONFIG no longer needed; CUDA/cuDNN TF32 irrelevant without CUDA
    assert diagnose(newer) == []


def test_status_command_prints_json_and_table():
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "detaudit", "status", "--format", "json"],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["settings"]["env.PYTHONHASHSEED"] == "0"
    assert data["settings"]["python.hash_randomization"] is False
    assert "env.PYTHONHASHSEED" not in {issue["setting"] for issue in data["nondeterministic"]}
    done = subprocess.run(
        [sys.executable, "-m", "detaudit", "status"], capture_output=True, text=True, env=env, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert "still nondeterministic:" in done.stdout
    assert "torch.are_deterministic_algorithms_enabled" in done.stdout
