"""The determinism fingerprint reads torch's real state and changes none of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from detaudit.runtime.environment import fingerprint, is_error

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str, env_extra: dict | None = None) -> str:
    """Run ``code`` in a fresh interpreter (for state that must not leak into
    this test process) and return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_fingerprint_matches_torch_state_and_is_json():
    result = fingerprint()
    json.dumps(result)  # serialisable as it is
    assert result["torch.version"] == torch.__version__
    assert result["torch.get_num_threads"] == torch.get_num_threads()
    assert result["torch.are_deterministic_algorithms_enabled"] == torch.are_deterministic_algorithms_enabled()
    assert result["torch.backends.cudnn.conv.fp32_precision"] == torch.backends.cudnn.conv.fp32_precision
    assert "env.PYTHONHASHSEED" in result and "env.CUBLAS_WORKSPACE_CONFIG" in result


def test_fingerprint_follows_a_changed_flag():
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = not before
        assert fingerprint()["torch.backends.cudnn.benchmark"] is (not before)
    finally:
        torch.backends.cudnn.benchmark = before
    assert fingerprint()["torch.backends.cudnn.benchmark"] is before


def test_environment_variables_recorded(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_DETERMINISTIC", "1")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    result = fingerprint()
    assert result["env.TORCHINDUCTOR_DETERMINISTIC"] == "1"
    assert result["env.CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert result["env.NCCL_ALGO"] is None


def test_mixed_tf32_apis_are_recorded_not_raised():
    # After the new API set TF32, torch's legacy getters raise; the fingerprint
    # still has the new-API value and an error marker for each legacy getter.
    out = run_python(
        """
        import json, torch
        from detaudit.runtime.environment import fingerprint
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        print(json.dumps(fingerprint()))
        """
    )
    result = json.loads(out)
    assert result["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
    assert is_error(result["torch.backends.cuda.matmul.allow_tf32"])
    assert "RuntimeError" in result["torch.get_float32_matmul_precision"]


def test_reading_imports_nothing_heavy_and_leaves_cuda_alone():
    out = run_python(
        """
        import sys, torch
        from detaudit.runtime.environment import fingerprint
        result = fingerprint()
        print("torch._inductor" in sys.modules, torch.cuda.is_initialized(),
              "torch._inductor.config.deterministic" in result)
        """
    )
    assert out.split() == ["False", "False", "False"]


def test_inductor_flags_read_once_inductor_is_imported():
    out = run_python(
        """
        import torch._inductor.config
        from detaudit.runtime.environment import fingerprint
        result = fingerprint()
        print(result["torch._inductor.config.deterministic"], result["torch._inductor.config.batch_invariant"])
        """,
        env_extra={"TORCHINDUCTOR_DETERMINISTIC": "1"},
    )
    assert out.split() == ["True", "False"]


def test_works_without_torch():
    out = run_python(
        """
        import sys, json
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
        from detaudit.runtime.environment import fingerprint
        print(json.dumps(fingerprint()))
        """
    )
    result = json.loads(out)
    assert result["torch.version"] is None
    assert "env.PYTHONHASHSEED" in result


@pytest.mark.cuda
def test_device_names_once_cuda_is_initialised():
    torch.zeros(1, device="cuda")
    devices = fingerprint()["torch.cuda.devices"]
    assert len(devices) == torch.cuda.device_count()
    assert torch.cuda.get_device_name(0) in devices[0]


def test_fingerprint_records_the_cpu_capability_torch_dispatches_to():
    capped = _run_fingerprint_of("ATEN_CPU_CAPABILITY", "default")
    assert capped["torch.backends.cpu.get_cpu_capability"] == "DEFAULT"
    assert capped["env.ATEN_CPU_CAPABILITY"] == "default"  # a child setting's variable is recorded, set or not
    assert fingerprint()["torch.backends.cpu.get_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def _run_fingerprint_of(variable: str, value: str) -> dict:
    """The fingerprint of a fresh process started with ``variable=value``."""
    code = "import json; from detaudit.runtime.environment import fingerprint; print(json.dumps(fingerprint()))"
    env = {**os.environ, variable: value}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
