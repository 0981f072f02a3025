"""Fuzzing the static pass with generated programs (hypothesmith), mixed with
the rules' own examples so that the rules run.  What must hold on any input is
in ``static_fuzzing.problems``; ``bench/fuzz_static.py`` runs the same oracle on
many more programs, and on mutated real files.

The run is derandomized (the same examples every run, so a failure reproduces);
a failure prints the generated program, the seed of the mixing, and the mixed
text (the ``note``).
"""

from __future__ import annotations

import random

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from static_fuzzing import problems, torch_flavoured

EXAMPLES = 150


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(program=hypothesmith.from_grammar(), seed=st.integers(0, 2**32 - 1), snippets=st.integers(0, 4))
def test_generated_programs_check_and_fix_cleanly(program, seed, snippets):
    text = torch_flavoured(program, random.Random(seed), snippets)
    note(f"checked text: {text!r}")
    assert problems(text) == []


#: Inputs the fuzzer made fail (each fixed since): (id, text)
FOUND: list[tuple[str, str]] = [
    # set-iteration-order sorted what built the set a loop iterates, never the
    # set itself: --fix added sorted() around `words` round after round
    ("loop-over-a-set-comprehension",
     "import torch\ndef build(words):\n    out = []\n    for w in {w.lower() for w in words}:\n        out.append(w)\n    return out\n"),
    # libcst drops a line holding only a backslash: its positions (and the
    # statement offsets) were a line early after it, and --fix deleted the line
    ("backslash-line-before-a-statement",
     "import torch\n\\\nimport lightning as L\nx = L.Trainer(deterministic=False)\ny = L.Trainer(deterministic=False)\n"),
]


@pytest.mark.parametrize("text", [text for _, text in FOUND], ids=[name for name, _ in FOUND])
def test_inputs_the_fuzzer_found(text):
    assert problems(text) == []
