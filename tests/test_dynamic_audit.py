"""detaudit.audit() and detaudit.testing.assert_deterministic, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import detaudit
from detaudit.testing import assert_deterministic


def small_mlp_step():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    inputs = torch.randn(32, 8)
    for _ in range(2):
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
    return {"model": model, "optimizer": optimizer}


def embedding_step():
    torch.set_num_threads(2)  # the CPU index_put_ race needs two threads
    table = torch.nn.Parameter(torch.randn(8, 8))
    optimizer = torch.optim.SGD([table], lr=0.1)
    token_ids = torch.randint(0, 8, (400_000,))
    weights = torch.randn(400_000, 8)
    (table[token_ids] * weights).sum().backward()
    optimizer.step()
    return {"table": table}


def test_audit_deterministic_step():
    report = detaudit.audit(small_mlp_step, repeats=3)
    assert report.deterministic and report.exit_code == 0
    assert report.traced_ops > 50
    assert report.to_dict()["verdict"] == "deterministic"


def test_audit_finds_the_index_put_race():
    report = detaudit.audit(embedding_step, repeats=4)
    assert report.verdict == "nondeterministic"
    [cause] = report.root_causes
    assert cause.kind == "nondeterministic-op" and cause.op.startswith("aten.index_put")
    assert cause.path.endswith("test_dynamic_audit.py")
    assert cause.line == embedding_step.__code__.co_firstlineno + 6  # the table[token_ids] line
    assert cause.phase == "backward"
    assert "table.grad" in {t["name"] for t in report.tensors}
    [finding] = report.findings()
    assert finding.code == "DYN001" and finding.details["op"] == cause.op


def test_audit_deterministic_mode_fixes_the_race():
    assert detaudit.audit(embedding_step, repeats=3, deterministic=True).deterministic


def uninitialized_bias_step():
    # a fresh 4 KiB block, taken and handed back before the bias: in one
    # process the allocator gives the bias the same bytes every repeat
    torch.zeros(1024)
    bias = torch.nn.Parameter(torch.empty(1024))
    (bias * 2).sum().backward()
    return {"bias": bias}


def test_audit_finds_a_read_of_uninitialized_memory_whatever_bytes_the_allocator_hands_back():
    report = detaudit.audit(uninitialized_bias_step, repeats=2)
    assert report.verdict == "nondeterministic"
    [cause] = report.root_causes
    assert cause.kind == "uninitialized-memory" and cause.op.startswith("aten.empty")
    assert cause.line == uninitialized_bias_step.__code__.co_firstlineno + 4  # the torch.empty line


def test_audit_leaves_torchs_own_fill_of_uninitialized_memory_alone():
    # deterministic algorithms fill torch.empty with NaN (fill_uninitialized_memory): the same in every run
    assert detaudit.audit(uninitialized_bias_step, repeats=2, deterministic=True).deterministic


def test_assert_deterministic_fails_with_the_rendered_report():
    assert_deterministic(small_mlp_step, repeats=2)

    def unseeded_step():
        torch.seed()
        return torch.nn.functional.dropout(torch.ones(64), 0.5)

    with pytest.raises(AssertionError) as failure:
        assert_deterministic(unseeded_step, repeats=2)
    text = str(failure.value)
    assert text.startswith("nondeterministic")
    assert "rng" in text and "test_dynamic_audit.py" in text
    words = " ".join(text.split())  # undo the console's line wrapping
    reseed_line = unseeded_step.__code__.co_firstlineno + 1
    assert "the generator state was set differently by torch.seed() at " in words
    assert f"{Path(__file__).name}:{reseed_line} (step 1)" in words
