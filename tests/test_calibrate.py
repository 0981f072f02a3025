"""``detaudit calibrate``: measuring ops on the installed torch and writing a
table the other commands accept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from detaudit.cli import main  # noqa: E402
from detaudit.knowledge import calibrate  # noqa: E402
from detaudit.knowledge.calibrate import Measurement, PhaseResult, calibrated_table, measure  # noqa: E402
from detaudit.knowledge.ops import SHIPPED_TABLE, load_ops_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shipped():
    return load_ops_table(SHIPPED_TABLE)


def test_every_entry_has_a_runnable_recipe_name(shipped):
    assert all(entry.recipe in calibrate.RECIPES for entry in shipped)


def test_calibrate_cpu_finds_put_raising_and_writes_a_loadable_table(tmp_path):
    output = tmp_path / "cpu.json"
    result = subprocess.run(
        [sys.executable, "-m", "detaudit", "calibrate", "--device", "cpu", "--only", "put", "--repeats", "2",
         "--output", str(output)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "raises (put_)" in result.stdout and f"wrote {output}" in result.stdout
    table = load_ops_table(output)
    assert table.provenance["kind"] == "calibrated" and table.provenance["device"] == "cpu"
    assert table.provenance["torch"] == torch.__version__ and table.provenance["measured"] == ["put"]
    assert table.torch_versions == "==" + torch.__version__.split("+")[0]
    put = table.entry("put")
    measured = [b for b in put.behaviours if b.torch]
    assert {(b.devices, b.phases, b.deterministic_mode) for b in measured} >= {(("cpu",), ("forward",), "raises")}
    assert any(b.devices == ("cuda",) for b in put.behaviours)  # CUDA facts are kept, not measured here
    raw = next(op for op in json.loads(output.read_text())["ops"] if op["id"] == "put")
    assert raw["measurements"][0]["forward"]["alert"] == "put_"
    assert raw["measurements"][0]["forward"]["aten"] == "aten.put_.default"
    # the written table drives the other commands
    assert main(["ops", "--table", str(output), "--format", "json"]) == 0


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the CPU index_put race needs two threads")
def test_cpu_index_put_race_shows_and_deterministic_mode_fixes_it():
    # a race needs both threads running at once: on a loaded machine it can hide
    # for a whole measurement, so up to three are taken before it counts as absent
    for _ in range(3):
        with calibrate._threads(calibrate.CPU_THREADS):
            result = measure("index_put-accumulate", "index_put_accumulate", "cpu", repeats=10)
        if result.error is not None or result.backward.default_runs_differ:
            break
    assert result.error is None
    assert result.backward.alert is None
    assert result.backward.default_runs_differ >= 1  # W[idx] backward: parallel index_put accumulate
    assert result.backward.deterministic_runs_differ == 0


def test_measured_facts_replace_the_device_and_keep_the_rest(shipped):
    version = torch.__version__.split("+")[0]
    measurements = [
        # an alert where the shipped table claims nothing on CPU
        Measurement("histc", forward=PhaseResult("histc_cpu", "aten.histc.default", 0, None, 3)),
        # a claimed CPU race that did not show: kept, deterministic mode still fixes it
        Measurement("put-accumulate", forward=PhaseResult(None, None, 0, 0, 3), backward=PhaseResult(None, None, 0, 0, 3)),
        # a race deterministic mode does not fix
        Measurement("index_copy", forward=PhaseResult(None, None, 2, 1, 3)),
        Measurement("sdpa-backward", error="RuntimeError: no kernel"),
    ]
    table = calibrated_table(shipped, measurements, "cpu")
    histc = table.entry("histc")
    assert "histc_cpu" in histc.alerts
    assert [b.deterministic_mode for b in histc.behaviours_for("cpu")] == ["raises"]
    assert histc.behaviours_for("cuda") == shipped.entry("histc").behaviours
    put = table.entry("put-accumulate")
    assert [b.deterministic_mode for b in put.behaviours_for("cpu")] == ["switches"]
    assert [b.deterministic_mode for b in put.behaviours_for("cuda")] == ["raises"]
    index_copy = table.entry("index_copy").behaviours_for("cpu", version)
    assert [b.deterministic_mode for b in index_copy] == ["nothing"]
    assert table.entry("sdpa-backward").behaviours == shipped.entry("sdpa-backward").behaviours
    assert table.provenance["failed"] == {"sdpa-backward": "RuntimeError: no kernel"}
    # an entry that showed nothing on CPU and claims nothing there stays CUDA-only
    quiet = calibrated_table(shipped, [Measurement("index_add", forward=PhaseResult(None, None, 0, 0, 3))], "cpu")
    assert quiet.entry("index_add").devices == ("cuda",)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_without_a_gpu_is_a_one_line_usage_error(tmp_path, capsys):
    assert main(["calibrate", "--device", "cuda", "--only", "put", "--output", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("detaudit: error: --device cuda needs a CUDA GPU") and len(err.splitlines()) == 1
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "no-such-op"], "unknown op 'no-such-op'"),
        (["--repeats", "1"], "--repeats must be at least 2"),
    ],
)
def test_bad_arguments_are_usage_errors(tmp_path, capsys, argv, message):
    assert main(["calibrate", *argv, "--output", str(tmp_path / "t.json")]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.cuda
def test_calibrate_cuda_index_add_switches(tmp_path):
    output = tmp_path / "cuda.json"
    assert main(["calibrate", "--device", "cuda", "--only", "index_add,put", "--output", str(output)]) == 0
    table = load_ops_table(output)
    assert table.provenance["device_name"] == torch.cuda.get_device_name(0)
    put_cuda = table.entry("put").behaviours_for("cuda", torch.__version__)
    assert {b.deterministic_mode for b in put_cuda if b.torch} == {"raises"}
