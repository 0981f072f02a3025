"""The real-code corpus (bench/realcode/corpus.json): well-formed, and its quick
entries get the verdict their plain runs give, run unchanged through
bench/realcode_dynamic.py. An entry whose mirror or package is missing here
skips; the data checks always run."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("realcode_dynamic", ROOT / "bench" / "realcode_dynamic.py")
realcode = importlib.util.module_from_spec(_spec)
sys.modules["realcode_dynamic"] = realcode  # dataclasses look their module up by name
_spec.loader.exec_module(realcode)
CORPUS = realcode.load_corpus()


def test_corpus_entries_are_complete():
    names = [script.name for script in CORPUS]
    assert len(names) == len(set(names)) >= 12
    for script in CORPUS:
        assert (script.repo is None) != (script.script is None), script.name
        if script.repo:
            assert re.fullmatch(r"[0-9a-f]{40}", script.commit) and script.path, script.name
        else:
            assert (ROOT / script.script).is_file(), script.name
        assert script.expected in ("deterministic", "nondeterministic"), script.name
        assert set(script.data) <= set(realcode.DATA_MAKERS), script.name


@pytest.mark.parametrize("script", [s for s in CORPUS if s.quick], ids=lambda s: s.name)
def test_quick_corpus_script_gets_the_plain_runs_verdict(script):
    missing = script.missing(realcode.DEFAULT_MIRRORS)
    if missing:
        pytest.skip(missing)
    outcome = realcode.audit(script, realcode.DEFAULT_MIRRORS, repeats=2, truth_runs=2, timeout=300)
    assert outcome.truth == script.expected, outcome.truth
    # exactly: a latent cause in a script whose runs are identical is a confusing report
    assert outcome.verdict == script.expected, (outcome.verdict, outcome.report and outcome.report.get("root_causes"))
