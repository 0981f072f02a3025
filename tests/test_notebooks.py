"""Notebooks: code cells checked as one program, findings located as cell:line in every format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from detaudit.findings import Finding
from detaudit.report.github import github_annotations
from detaudit.report.sarif import to_sarif
from detaudit.static.engine.check import check_file
from detaudit.static.engine.notebooks import notebook_source
from detaudit.static.engine.sources import UnreadableSource
from detaudit.static.rule import all_rules

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "fixtures" / "static" / "notebooks"


def _notebook(tmp_path: Path, *cells: str | tuple[str, str], metadata: dict | None = None) -> Path:
    entries = []
    for cell in cells:
        kind, source = cell if isinstance(cell, tuple) else ("code", cell)
        entries.append({"cell_type": kind, "metadata": {}, "source": source.splitlines(keepends=True)})
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": metadata or {}, "cells": entries}))
    return path


def _findings(path: Path) -> list[Finding]:
    return check_file(path, path.name, path.parent).findings


def test_fixture_findings_are_located_by_cell_and_line():
    found = [(f.code, f.location) for f in _findings(NOTEBOOKS / "train.ipynb")]
    assert found == [("DET006", "train.ipynb:cell 4:1:1"), ("DET031", "train.ipynb:cell 4:4:10")]


def test_magics_shell_and_help_lines_keep_line_numbers_and_indentation():
    unit = notebook_source((NOTEBOOKS / "train.ipynb").read_bytes())
    lines = unit.text.splitlines()
    assert lines[0] == "pass"  # %matplotlib inline
    assert lines[3] == "pass" and lines[4] == "files = None"  # !pip ..., files = !ls data
    assert lines[7] == "    pass"  # %time inside a loop body
    assert unit.locate(6) == (4, 1)  # the %%bash cell (3) is skipped entirely
    assert all(cell != 3 for cell, _ in unit.cell_lines)


def test_every_output_format_names_the_cell():
    findings = _findings(NOTEBOOKS / "train.ipynb")
    entropy = next(f for f in findings if f.code == "DET006")
    assert entropy.to_dict()["cell"] == 4 and entropy.to_dict()["line"] == 1
    sarif = to_sarif(findings, all_rules())
    result = next(r for r in sarif["runs"][0]["results"] if r["ruleId"] == "DET006")
    assert result["properties"] == {"notebookCell": 4}
    assert result["message"]["text"].startswith("cell 4: ")
    annotation = next(line for line in github_annotations(findings).splitlines() if "DET006" in line)
    assert "cell 4, line 1:" in annotation and "line=" not in annotation


def test_malformed_notebook_is_a_parse_error_and_other_files_continue(tmp_path):
    results = [check_file(p, p.name, NOTEBOOKS) for p in (NOTEBOOKS / "malformed.ipynb", NOTEBOOKS / "train.ipynb")]
    assert [f.code for f in results[0].findings] == ["DET000"]
    assert "malformed notebook" in results[0].findings[0].message
    assert results[1].findings


@pytest.mark.parametrize("content", [b"[]", b'{"worksheets": []}', b'{"cells": [{"cell_type": "code", "source": 3}]}'])
def test_structurally_wrong_notebooks_are_rejected_with_one_line(content):
    with pytest.raises(UnreadableSource) as error:
        notebook_source(content)
    assert "\n" not in str(error.value)


def test_syntax_error_points_at_its_cell(tmp_path):
    path = _notebook(tmp_path, "import torch\n", ("markdown", "text"), "x = (\n")
    [finding] = _findings(path)
    assert (finding.code, finding.cell, finding.line) == ("DET000", 3, 1)


def test_suppression_comment_in_a_cell(tmp_path):
    path = _notebook(tmp_path, "import random\nrandom.seed()  # detaudit: ignore[entropy-seed] -- demo notebook\n")
    result = check_file(path, path.name, tmp_path)
    assert [f.code for f in result.findings if f.code == "DET006"] == []
    assert [(f.code, f.cell, f.suppressed_reason) for f in result.suppressed] == [("DET006", 1, "demo notebook")]


def test_notebooks_of_other_kernels_are_not_checked(tmp_path):
    path = _notebook(tmp_path, "library(torch)\nrandom.seed()\n", metadata={"kernelspec": {"language": "R"}})
    assert _findings(path) == []


def test_cli_checks_notebooks_in_json(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "detaudit", "check", str(NOTEBOOKS / "train.ipynb"), "--format", "json"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 1, completed.stderr
    findings = json.loads(completed.stdout)["findings"]
    assert {(f["code"], f["cell"], f["line"]) for f in findings} == {("DET006", 4, 1), ("DET031", 4, 4)}
