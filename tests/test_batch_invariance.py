"""detaudit.audit_batch_invariance on real models (torch 2.13 CPU): verdict,
per batch size and position, the first op that differs, and kernel variance
told apart from sample mixing."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import torch
from batch_truth import differing_samples, variant_cells

import detaudit
from detaudit.dynamic.batch.audit import BatchInvarianceError, batch_positions, sample_slices
from detaudit.dynamic.batch.report import BatchReport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dynamic" / "batch"


def fixture(name: str) -> dict:
    return runpy.run_path(str(FIXTURES / f"{name}.py"), run_name="fixture")


def marked_line(name: str, marker: str) -> int:
    lines = (FIXTURES / f"{name}.py").read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if marker in line)


def audit_fixture(name: str, **options) -> BatchReport:
    namespace = fixture(name)
    return detaudit.audit_batch_invariance(namespace["model"], namespace["detaudit_batch_samples"](), **options)


def differing_cells(report: BatchReport) -> set[tuple[int, int]]:
    return {(cell.batch_size, cell.position) for cell in report.cells if not cell.matched}


def test_matmul_classifier_differs_where_plain_torch_does_and_names_the_matmul():
    namespace = fixture("mlp_classifier")
    samples = namespace["detaudit_batch_samples"]()
    sizes = (1, 2, 4, 8, 32)
    expected = differing_samples(namespace["model"], samples, sizes)
    variant = variant_cells(namespace["model"], samples, sizes)
    assert (32, 0) in variant, "a 32-row GEMM blocks differently from a one-row product on every CPU seen"
    report = audit_fixture("mlp_classifier")
    assert report.verdict == "batch-variant" and report.exit_code == 1
    assert differing_cells(report) == variant
    for cell in report.cells:
        assert cell.samples == 8
        assert len(cell.differing) == expected[(cell.batch_size, cell.position)]
        assert (cell.max_abs_diff > 0 and cell.max_ulp > 0) == ((cell.batch_size, cell.position) in variant)
    [cause] = report.root_causes
    assert (cause.kind, cause.code, cause.op) == ("batch-variant-op", "DYN009", "aten.mm.default")
    assert cause.path.endswith("mlp_classifier.py") and cause.line == marked_line("mlp_classifier", "batch-variant matmul")
    assert (cause.module, cause.device, cause.inputs) == ("model", "cpu", "match")
    assert set(cause.cells) == differing_cells(report)
    assert 0 < cause.max_abs_diff < 1e-4 and cause.max_ulp > 0
    assert "matrix multiplication" in cause.why and "rows" in cause.why
    assert any("fixed size" in remedy for remedy in cause.remedies)
    assert not any("cuBLAS" in remedy or "split-K" in remedy for remedy in cause.remedies), "CUDA remedies on a CPU op"


def test_attention_block_names_the_first_op_that_differs():
    """LayerNorm is batch-invariant; whether SDPA or the output projection is
    the first op to differ depends on the CPU: the audit must name that one."""
    namespace = fixture("attention_block")
    model, samples, sizes = namespace["model"], namespace["detaudit_batch_samples"](), (1, 2, 8)
    normed = model.norm(samples).detach().view(-1, model.heads, 1, model.head_dim)

    def attention(queries):
        batch = queries.shape[0]
        keys, values = (model.keys.expand(batch, -1, -1, -1), model.values.expand(batch, -1, -1, -1))
        return torch.nn.functional.scaled_dot_product_attention(queries, keys, values)

    assert not variant_cells_or_empty(lambda batch: model.norm(batch), samples, sizes)
    variant = variant_cells(model, samples, sizes)
    report = audit_fixture("attention_block", batch_sizes=sizes)
    assert report.verdict == "batch-variant"
    assert differing_cells(report) == variant
    [cause] = report.root_causes
    assert cause.kind == "batch-variant-op"
    if variant_cells_or_empty(attention, normed, sizes):
        assert cause.op == "aten._scaled_dot_product_flash_attention_for_cpu.default"
        assert cause.line == marked_line("attention_block", "batch-variant attention")
        assert "attention" in cause.why
    else:
        assert cause.op == "aten.addmm.default" and cause.module == "model.out"
        assert cause.line == marked_line("attention_block", "output projection")
        assert "matrix multiplication" in cause.why


def variant_cells_or_empty(entry, samples, sizes) -> set:
    return {cell for cell, count in differing_samples(entry, samples, sizes).items() if count}


def test_layernorm_model_is_invariant():
    report = audit_fixture("layernorm_model")
    assert report.verdict == "batch-invariant" and report.exit_code == 0
    assert report.root_causes == [] and all(cell.matched for cell in report.cells)
    assert [cell.batch_size for cell in report.cells] == [1, 2, 2, 4, 4, 4, 8, 8, 8, 32, 32, 32]
    assert report.verdict_line().startswith("batch-invariant: each of 8 samples")


def test_training_mode_batchnorm_is_sample_mixing_not_kernel_variance():
    namespace = fixture("batchnorm_train")
    model = namespace["model"]
    running_mean = model.norm.running_mean.clone()
    report = detaudit.audit_batch_invariance(namespace["detaudit_batch_entry"], namespace["detaudit_batch_samples"]())
    [cause] = report.root_causes
    assert (cause.kind, cause.code, cause.op) == ("sample-mixing", "DYN010", "aten.native_batch_norm.default")
    assert cause.module == "model.norm" and cause.line == marked_line("batchnorm_train", "mixes samples")
    assert "model.eval()" in cause.remedies[0]
    assert differing_cells(report) == {(c.batch_size, c.position) for c in report.cells if c.batch_size > 1}
    # the audit ran the model in training mode 70-odd times: its statistics are as they were
    assert torch.equal(model.norm.running_mean, running_mean) and model.norm.num_batches_tracked.item() == 0


def test_a_mixing_op_behind_a_variant_matmul_is_reported_too():
    weight = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0)) / 32
    norm = torch.nn.BatchNorm1d(1024)  # training mode

    def model(batch):
        hidden = torch.mm(batch, weight)
        return norm(hidden.unsqueeze(-1).expand(-1, -1, 2))

    samples = torch.randn(4, 1024, generator=torch.Generator().manual_seed(1))
    report = detaudit.audit_batch_invariance(model, samples, batch_sizes=(1, 4))
    kinds = {(cause.kind.name, cause.op) for cause in report.root_causes}
    assert kinds == {("batch-variant-op", "aten.mm.default"), ("sample-mixing", "aten.native_batch_norm.default")}


def test_dropout_in_training_mode_draws_per_batch():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))  # not in eval mode
    torch.nn.init.eye_(model[0].weight)
    samples = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    report = detaudit.audit_batch_invariance(lambda batch: model[1](batch), samples, batch_sizes=(1, 2))
    [cause] = report.root_causes
    assert cause.kind == "rng" and ("bernoulli" in cause.op or "dropout" in cause.op)
    assert [cell.matched for cell in report.cells if cell.batch_size == 1] == [True], "reseeded: the control matches"


def test_a_branch_on_the_batch_size_is_control_flow():
    def model(batch):
        if batch.shape[0] > 1:
            batch = batch * 2
        return batch + 1

    report = detaudit.audit_batch_invariance(model, torch.randn(4, 3), batch_sizes=(1, 2))
    [cause] = report.root_causes
    assert cause.kind == "control-flow" and cause.op == "aten.add.Tensor"
    assert cause.other_side.op == "aten.mul.Tensor"
    assert "in the batch the model ran aten.mul.Tensor" in cause.message()


def test_state_kept_between_calls_shows_in_the_batch_size_one_control():
    counter = torch.zeros(1)

    def model(batch):
        counter.add_(1)  # a Python-held tensor: not a module buffer, so not put back
        return batch + counter

    report = detaudit.audit_batch_invariance(model, torch.randn(4, 3), batch_sizes=(1,))
    [cell] = report.cells
    assert not cell.matched
    [cause] = report.root_causes
    assert cause.kind == "nondeterministic-op" and cause.op == "aten.add_.Tensor" and cause.inputs == "differs"
    assert "state kept between calls" in cause.message()
    assert any("run-to-run nondeterminism" in note for note in report.notes)


def test_tuple_and_dict_samples_and_named_outputs():
    weight = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0)) / 32

    def model(features, mask):
        logits = torch.mm(features, weight) * mask
        return {"logits": logits, "loss": logits.mean()}

    features = torch.randn(4, 1024, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, 1024)
    by_position = detaudit.audit_batch_invariance(model, (features, mask), batch_sizes=(4,), localize=False)
    by_name = detaudit.audit_batch_invariance(model, {"features": features, "mask": mask}, batch_sizes=(4,), localize=False)
    for report in (by_position, by_name):
        assert report.verdict == "batch-variant" and report.root_causes == []
        assert report.outputs == ["logits"]  # the batch mean has no per-sample slice
        assert any("loss" in note for note in report.notes)


@pytest.mark.parametrize("time", [3, 1])
def test_sequence_first_layout_finds_the_matmul_through_a_merged_axis(time):
    # [time, batch, features] flattened to [time * batch, features]: the samples interleave
    # (with one step they do not; it is the shape whose GEMM varies on AVX-512 CPUs)
    weight = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) / 16

    def model(sequences):
        steps, batch, features = sequences.shape
        mixed = torch.mm(sequences.reshape(steps * batch, features), weight)  # the matmul
        return torch.tanh(mixed).reshape(steps, batch, features)

    samples = torch.randn(time, 8, 256, generator=torch.Generator().manual_seed(1))
    variant_cells(lambda batch: model(batch.transpose(0, 1)).transpose(0, 1), samples.transpose(0, 1), (1, 8))
    report = detaudit.audit_batch_invariance(model, samples, batch_sizes=(1, 8), dim=1)
    assert report.verdict == "batch-variant"
    [cause] = report.root_causes
    assert (cause.op, cause.inputs) == ("aten.mm.default", "match")


def test_positions_all_and_negative():
    report = detaudit.audit_batch_invariance(lambda x: x * 2, torch.randn(3, 2), batch_sizes=(4,), positions="all")
    assert [cell.position for cell in report.cells] == [0, 1, 2, 3]
    report = detaudit.audit_batch_invariance(lambda x: x * 2, torch.randn(3, 2), batch_sizes=(2, 4), positions=(-1, 5))
    assert [(cell.batch_size, cell.position) for cell in report.cells] == [(2, 1), (4, 3)]
    assert batch_positions(None, 1) == [0] and batch_positions(None, 5) == [0, 2, 4]


def test_sample_slices_relate_shapes():
    batch = torch.arange(24.0).reshape(4, 6)
    assert torch.equal(sample_slices(batch, (1, 6), 4, 2)[0], batch[2:3])
    assert sample_slices(batch, (4, 6), 4, 2)[0] is batch  # same shape: shared, compared whole
    assert sample_slices(batch, (1, 5), 4, 2) is None  # no axis a batch explains
    merged = torch.arange(24.0).reshape(12, 2)  # 4 samples x 3 rows
    batch_major, sequence_first = sample_slices(merged, (3, 2), 4, 1)
    assert torch.equal(batch_major, merged[3:6]) and torch.equal(sequence_first, merged[1::4])


@pytest.mark.parametrize(
    "samples, message",
    [
        (torch.randn(1, 4), "at least 2 samples"),
        ((torch.randn(3, 4), torch.randn(2, 4)), "disagree"),
        ("not a tensor", "must be a tensor"),
    ],
)
def test_bad_samples_are_one_line_errors(samples, message):
    with pytest.raises(BatchInvarianceError, match=message):
        detaudit.audit_batch_invariance(lambda x: x, samples)


def test_a_model_that_fails_on_a_batch_says_which():
    model = torch.nn.BatchNorm1d(4)  # training mode: a batch of one row has no variance

    with pytest.raises(BatchInvarianceError, match="failed on a batch of 1 sample"):
        detaudit.audit_batch_invariance(model, torch.randn(4, 4))


def test_the_callers_random_state_is_untouched():
    samples = torch.randn(3, 2)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    detaudit.audit_batch_invariance(lambda x: x + torch.rand_like(x), samples, batch_sizes=(1, 2))
    assert torch.equal(torch.rand(3), expected)


def test_report_round_trips_through_json_and_writes_findings():
    report = audit_fixture("batchnorm_train", batch_sizes=(1, 2))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["verdict"] == "batch-variant" and data["root_causes"][0]["code"] == "DYN010"
    assert data["cells"][1] == {
        "batch_size": 2, "position": 0, "matched": False, "samples": 8, "differing": list(range(8)),
        "max_abs_diff": data["cells"][1]["max_abs_diff"], "max_ulp": data["cells"][1]["max_ulp"],
        "fraction_differing": 1.0, "causes": [0],
    }
    again = BatchReport.from_dict(data)
    assert again.to_dict() == report.to_dict()
    [finding] = again.findings()
    assert (finding.code, finding.name, finding.line) == ("DYN010", "sample-mixing", report.root_causes[0].line)
    assert finding.fix_hint.startswith("Invariant with: model.eval()")
    text = again.to_text()
    assert "#1" in text and "why: BatchNorm in training mode" in text
    assert "<failure" in again.to_junit_xml()
