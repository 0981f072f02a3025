"""The resume corpus (bench/realcode/resume_corpus.json): well-formed, and
each entry gets the verdict and first component its plain runs give, run
unchanged through bench/realcode_resume.py (skipped where its mirror is missing)."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from detaudit.resume.components import COMPONENTS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
_spec = importlib.util.spec_from_file_location("realcode_resume", ROOT / "bench" / "realcode_resume.py")
realcode_resume = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(realcode_resume)
ENTRIES = realcode_resume.load_corpus()


def test_resume_corpus_entries_are_complete():
    assert ENTRIES
    for entry in ENTRIES:
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and entry["path"], entry["name"]
        assert entry["expected"] in ("equivalent", "diverges"), entry["name"]
        assert entry["expected_first"] in COMPONENTS, entry["name"]
        assert 0 < entry["interrupt_at"] < entry["steps"] and re.compile(entry["loss_lines"]).groups == 2


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["name"])
def test_resume_corpus_script_gets_the_plain_runs_verdict(entry):
    script = realcode_resume.CorpusScript.from_json({k: v for k, v in entry.items() if k not in realcode_resume.RESUME_FIELDS})
    missing = script.missing(realcode_resume.DEFAULT_MIRRORS)
    if missing:
        pytest.skip(missing)
    outcome = realcode_resume.audit(entry, realcode_resume.DEFAULT_MIRRORS)
    assert outcome["truth"] == entry["expected"]
    assert outcome["right"], outcome
