"""The divergence of a pair of runs, op by op: what the HTML report's chart draws."""

from __future__ import annotations

import json

import torch

import detaudit
from detaudit.dynamic.compare.classify import Trace, compare_traces
from detaudit.dynamic.compare.divergence import PROPAGATED, ROOT, divergence_of
from detaudit.dynamic.record.digests import SAMPLE_ELEMENTS, output_sample
from detaudit.dynamic.record.tracer import OpTracer
from detaudit.launch.watcher import TrainingWatcher


def two_embedding_steps():
    """index_put_'s CPU race in the first backward, spreading through the
    optimizer into the second step's forward (a lookup too large to keep whole)."""
    torch.set_num_threads(2)
    table = torch.nn.Parameter(torch.randn(8, 8))
    optimizer = torch.optim.SGD([table], lr=0.1)
    token_ids = torch.randint(0, 8, (400_000,))
    weights = torch.randn(400_000, 8)
    for _ in range(2):
        optimizer.zero_grad()
        (table[token_ids] * weights).sum().backward()
        optimizer.step()
    return {"table": table}


def test_the_pair_parts_ways_at_the_root_cause_and_the_difference_spreads():
    report = detaudit.audit(two_embedding_steps, repeats=2)
    divergence = report.divergence
    assert divergence is not None and divergence.runs == (1, 2) and divergence.steps == [1, 2]
    [cause] = report.root_causes
    first = divergence.points[0]
    assert (first.status, first.kind, first.op, first.line) == (ROOT, "nondeterministic-op", cause.op, cause.line)
    # the chart's root point is the root cause's own measurement: one number in every format
    assert first.max_abs_diff == cause.max_abs_diff > 0 and not first.sampled
    assert all(point.record > first.record for point in divergence.points[1:])
    assert {point.status for point in divergence.points} == {ROOT, PROPAGATED}
    compared = divergence.equal_ops + len(divergence.points)
    assert compared == divergence.compared_ops == divergence.end - divergence.start
    # the optimizer step carries it into the second forward, whose lookup is measured on a sample
    lookup = next(p for p in divergence.points if p.step == 2 and p.op == "aten.index.Tensor")
    assert lookup.status == PROPAGATED and lookup.sampled and lookup.max_abs_diff > 0
    assert [span.phase for span in divergence.spans] == ["forward", "backward", "optimizer"] * 2
    data = json.loads(json.dumps(report.to_dict()))["divergence"]
    assert data["points"][0]["max_abs_diff"] == cause.max_abs_diff and data["equal_ops"] == divergence.equal_ops


def test_a_deterministic_run_has_no_divergence():
    def step():
        layer = torch.nn.Linear(4, 2)
        layer(torch.ones(3, 4)).sum().backward()
        return layer

    report = detaudit.audit(step, repeats=2)
    assert report.deterministic and report.divergence is None and report.to_dict()["divergence"] is None


def _trace(branch: bool) -> Trace:
    watcher = TrainingWatcher()
    tracer = OpTracer()
    tracer.attach(watcher)
    try:
        with tracer:
            x = torch.ones(4, 4) * 2
            y = x + 1
            z = y.sum() if branch else y.mean()
            (z * 3).exp()
    finally:
        watcher.close()
    return Trace(**tracer.trace_data())


def test_control_flow_ends_the_comparison_where_the_runs_take_different_paths():
    reference, other = _trace(True), _trace(False)
    comparison = compare_traces(reference, other)
    divergence = divergence_of(reference, comparison, 1)
    at = next(i for i, op in enumerate(reference.ops) if op.op == "aten.sum.default")
    assert divergence.control_flow_at == at
    assert divergence.points == [] and divergence.compared_ops == at - divergence.start
    assert divergence.end == len(reference.ops)  # the ops after the split are shown, uncompared


def test_output_samples_are_whole_when_small_and_evenly_spaced_when_large():
    small = torch.arange(100.0).reshape(10, 10)
    assert torch.equal(output_sample(small), small.reshape(-1))
    large = torch.arange(3 * SAMPLE_ELEMENTS, dtype=torch.float64).reshape(3, -1).t()  # not contiguous
    sample = output_sample(large)
    assert sample.numel() <= SAMPLE_ELEMENTS and sample.is_contiguous()
    flat = large.reshape(-1)
    assert torch.equal(sample, flat[:: flat.numel() // sample.numel()][: sample.numel()])
    assert torch.equal(output_sample(large + 1), sample + 1)  # the same positions for the same size
