"""Catalogue part A (DET012-018, DET020, DET040-043) on fixture files and real torch.

Each fixture marks the lines that must be reported with ``# expect: CODE``; every
other line must stay clean of these rules (look-alikes live next to the hazards).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import libcst as cst
import pytest

from detaudit.static.analyses import determinism
from detaudit.static.engine.check import analyse_source, check_file, check_source
from detaudit.static.engine.facts import FactCollector, FileFacts

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures" / "static" / "catalogue_a"
CODES = {"DET012", "DET013", "DET014", "DET015", "DET016", "DET017", "DET018", "DET020", "DET040", "DET041", "DET042", "DET043"}
EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>(?:DET\d{3}\s*)+)")


def _expected(path: Path) -> Counter:
    expected = Counter()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = EXPECT.search(line)
        if match:
            expected.update((number, code) for code in match.group("codes").split())
    return expected


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.py")), ids=lambda p: p.name)
def test_fixture_findings_match_expectations(fixture):
    result = check_file(fixture, fixture.name, FIXTURES)
    found = Counter((f.line, f.code) for f in result.findings if f.code in CODES)
    assert found == _expected(fixture)


def _state(source: str):
    module = cst.parse_module(textwrap.dedent(source))
    facts = FileFacts()
    cst.visit_batched(module, [FactCollector(facts, module)])
    return determinism.analyse(facts)


@pytest.mark.parametrize(
    ("source", "enabled", "warn_only"),
    [
        ("import torch\ntorch.use_deterministic_algorithms(True)\n", True, False),
        ("import torch\ntorch.use_deterministic_algorithms(mode=True, warn_only=True)\n", True, True),
        ("import torch\ntorch.set_deterministic_debug_mode('error')\n", True, False),
        ("import torch\ntorch.set_deterministic_debug_mode(1)\n", True, True),
        ("import lightning as L\nL.Trainer(deterministic='warn')\n", True, True),
        ("from transformers import TrainingArguments\nTrainingArguments('o', full_determinism=True)\n", True, False),
        ("import detaudit\ndetaudit.enable_determinism(strict=False)\n", True, True),
        ("import torch\ntorch.backends.cudnn.deterministic = True\n", False, False),  # cuDNN only
        ("from transformers import set_seed\nset_seed(0)\n", False, False),
        ("import torch\ntorch.use_deterministic_algorithms(flag)\n", False, False),  # unknown value
    ],
)
def test_determinism_state_reads_every_switch(source, enabled, warn_only):
    state = _state(source)
    assert (state.enabled, state.warn_only) == (enabled, warn_only)


def test_determinism_state_is_computed_once_per_file():
    _, context = analyse_source("import torch\ntorch.use_deterministic_algorithms(True)\n", "train.py")
    assert context.analyses.determinism is context.analyses.determinism


def test_nondeterministic_op_follows_a_calibrated_table(tmp_path, monkeypatch):
    """A table written by `detaudit calibrate` replaces the shipped one: if the
    measured index_add kernel raises under deterministic mode, the rule says so."""
    from detaudit.knowledge.ops import SHIPPED_TABLE, TABLE_ENV_VAR

    document = json.loads(SHIPPED_TABLE.read_text())
    for entry in document["ops"]:
        if entry["id"] == "index_add":
            for behaviour in entry["behaviours"]:
                behaviour["deterministic_mode"] = "raises"
    table = tmp_path / "calibrated.json"
    table.write_text(json.dumps(document))
    source = "import torch\ntorch.use_deterministic_algorithms(True)\nout.index_add_(0, index, src)\n"
    assert not [f for f in check_source(source).findings if f.code == "DET020"]
    monkeypatch.setenv(TABLE_ENV_VAR, str(table))
    (finding,) = [f for f in check_source(source).findings if f.code == "DET020"]
    assert finding.line == 3 and "will raise under deterministic mode on CUDA" in finding.message


def test_default_mode_locates_every_call_site_of_an_op():
    source = "import torch\nfor i in range(3):\n    a.index_add_(0, i, b)\nc.index_add_(0, j, d)\ne.scatter_add_(0, k, f)\n"
    findings = [f for f in check_source(source).findings if f.code == "DET020"]
    assert [(f.line, f.message.partition(" (call site ")[2]) for f in findings] == [
        (3, "1 of 2 in this file)."),
        (4, "2 of 2 in this file)."),
        (5, ""),
    ]


def test_each_call_site_is_suppressed_on_its_own_line():
    source = "import torch\na.index_add_(0, i, b)  # detaudit: ignore[DET020]\nc.index_add_(0, j, d)\n"
    findings = [f for f in check_source(source).findings if f.code == "DET020"]
    assert [f.line for f in findings] == [3]


def test_catalogue_a_rules_import_neither_torch_nor_numpy():
    code = (
        "import sys\n"
        "from detaudit.static.engine.check import check_source\n"
        "from detaudit.static.rules.kernels import nondeterministic_op\n"
        "from detaudit.static.rules.other_frameworks import (jax_determinism_not_requested, tf_determinism_not_requested,\n"
        "    tf_missing_seed, xla_nondeterministic_ops)\n"
        "from detaudit.static.rules.settings import (compile_autotune, cublas_workspace_config, determinism_not_requested,\n"
        "    deterministic_off, deterministic_warn_only, framework_determinism_off, unknown_backend_flag)\n"
        "check_source('import torch\\nx.index_add_(0, i, s)\\n')\n"
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
