"""`detaudit run SCRIPT --vary batch` end to end, on the batch fixtures:
the script's detaudit_batch_entry audited in a child process, text and JSON
reports, the shared writers, exit codes."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from batch_truth import differing_samples, variant_cells

from detaudit.cli import main

ROOT = Path(__file__).resolve().parents[1]
BATCH = ROOT / "fixtures" / "dynamic" / "batch"


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main(["run", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _line_of(name: str, marker: str) -> int:
    lines = (BATCH / name).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line)


def test_matmul_classifier_text_report_names_the_matmul_line(capsys, tmp_path):
    junit = tmp_path / "junit.xml"
    code, out, err = _run(capsys, BATCH / "mlp_classifier.py", "--vary", "batch", "--junit-xml", junit)
    assert code == 1
    assert "batch invariance audit: ok in" in err  # the progress line
    first, *rest = out.splitlines()
    namespace = runpy.run_path(str(BATCH / "mlp_classifier.py"), run_name="fixture")
    samples = namespace["detaudit_batch_samples"]()
    expected = differing_samples(namespace["model"], samples, (1, 2, 4, 8, 32))
    variant = variant_cells(namespace["model"], samples, (1, 2, 4, 8, 32))
    assert first.startswith("batch-variant: ") and f"in {len(variant)} of 12 batch size × position cells" in first
    line = _line_of("mlp_classifier.py", "batch-variant matmul")
    assert f"mlp_classifier.py:{line}: batch-variant-op: aten.mm.default in model" in out
    rows = [row for row in rest if row.startswith("│ ") and row.split("│")[1].strip().isdigit()]
    # batch, position, samples differing ...: as many as plain torch calls show on this CPU
    by_cell = {(int(r.split("│")[1]), int(r.split("│")[2])): r.split("│")[3].strip() for r in rows}
    assert by_cell == {cell: f"{count}/8" for cell, count in expected.items()}
    assert "why: matrix multiplication" in out and "fix: run every batch at one fixed size" in out
    assert ElementTree.parse(junit).getroot().get("failures") == "1"


def test_attention_block_json_report(capsys):
    namespace = runpy.run_path(str(BATCH / "attention_block.py"), run_name="fixture")
    variant = variant_cells(namespace["model"], namespace["detaudit_batch_samples"](), (1, 2, 4))
    code, out, _ = _run(capsys, BATCH / "attention_block.py", "--vary", "batch", "--batch-sizes", "1,2,4", "--format", "json")
    report = json.loads(out)
    assert code == 1 and report["verdict"] == "batch-variant"
    assert report["target"].endswith("attention_block.py") and report["batch_sizes"] == [1, 2, 4]
    cells = [(1, 0), (2, 0), (2, 1), (4, 0), (4, 2), (4, 3)]
    assert [(c["batch_size"], c["position"], c["matched"]) for c in report["cells"]] == [
        (*cell, cell not in variant) for cell in cells
    ]
    [cause] = report["root_causes"]
    assert cause["kind"] == "batch-variant-op" and cause["code"] == "DYN009"
    # which op differs first depends on the CPU (tests/test_batch_invariance.py checks which)
    assert cause["op"] in {"aten._scaled_dot_product_flash_attention_for_cpu.default", "aten.addmm.default"}
    marker = "batch-variant attention" if "attention" in cause["op"] else "output projection"
    assert cause["line"] == _line_of("attention_block.py", marker)
    first = min(variant)
    assert cause["cells"][0] == {"batch_size": first[0], "position": first[1]} and cause["max_abs_diff"] > 0
    assert "torch.version" in json.dumps(report["environment"])


def test_layernorm_model_is_invariant_and_exits_0(capsys, tmp_path):
    junit = tmp_path / "junit.xml"
    code, out, _ = _run(
        capsys, BATCH / "layernorm_model.py", "--vary", "batch", "--positions", "all", "--batch-sizes", "1,4",
        "--format", "json", "--junit-xml", junit,
    )
    report = json.loads(out)
    assert code == 0 and report["verdict"] == "batch-invariant" and report["root_causes"] == []
    assert [c["position"] for c in report["cells"]] == [0, 0, 1, 2, 3]
    assert ElementTree.parse(junit).getroot().get("failures") == "0"


def test_training_mode_batchnorm_through_sarif_is_sample_mixing(capsys):
    code, out, _ = _run(capsys, BATCH / "batchnorm_train.py", "--vary", "batch", "--batch-sizes", "2", "--format", "sarif")
    sarif = json.loads(out)
    assert code == 1
    [result] = sarif["runs"][0]["results"]
    assert result["ruleId"] == "DYN010" and "sample-mixing" in result["message"]["text"]
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == _line_of("batchnorm_train.py", "mixes samples")
    [rule] = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert rule["name"] == "sample-mixing"


def test_a_script_without_the_entry_points_is_not_run(capsys, tmp_path):
    script = tmp_path / "train.py"
    marker = tmp_path / "trained"
    script.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n")
    code, _, err = _run(capsys, script, "--vary", "batch")
    assert code == 2
    assert "defines no detaudit_batch_entry() and no detaudit_batch_samples() at module level" in err
    assert not marker.exists(), "the training script ran although it cannot be audited"


def test_batch_options_need_vary_batch(capsys):
    code, _, err = _run(capsys, BATCH / "mlp_classifier.py", "--positions", "all")
    assert code == 2 and err.strip() == "detaudit: error: --positions goes with --vary batch"


def test_the_parent_side_imports_neither_torch_nor_numpy():
    code = (
        "import sys; import detaudit.dynamic.batch.vary, detaudit.dynamic.batch.report, detaudit.dynamic.variations; "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == ["False", "False"]
