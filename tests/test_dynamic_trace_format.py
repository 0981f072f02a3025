"""The trace format: what the tracer writes is what the comparison reads, and
reading it needs neither torch nor numpy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from detaudit.dynamic.compare.trace_format import (
    ALLOCATED,
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    SETUP,
    UNINIT,
    OpRecord,
    RngEvent,
    Trace,
)
from detaudit.dynamic.record.tracer import OpTracer
from detaudit.launch.watcher import TrainingWatcher

ROOT = Path(__file__).resolve().parents[1]

_IMPORT_THE_COMPARISON = """
import sys
import detaudit.dynamic.compare.classify, detaudit.dynamic.verdict.build, detaudit.dynamic.compare.divergence
print(sorted({"torch", "numpy"} & set(sys.modules)))
"""


def test_comparing_traces_imports_neither_torch_nor_numpy():
    # the parent process of `detaudit run` only reads traces
    check = subprocess.run(
        [sys.executable, "-c", _IMPORT_THE_COMPARISON], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "[]"


def _traced_step() -> tuple[Trace, dict[str, int]]:
    """One real training step, traced; returns the trace and the lines of its calls."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watcher = TrainingWatcher()
    tracer = OpTracer()
    tracer.attach(watcher)
    lines = {}
    try:
        with tracer:
            lines["seed"] = sys._getframe().f_lineno + 1
            torch.seed()
            lines["forward"] = sys._getframe().f_lineno + 1
            loss = torch.nn.functional.dropout(model(torch.ones(3, 4)), 0.5).sum()
            loss.backward()
            optimizer.step()
            lines["empty"] = sys._getframe().f_lineno + 1
            torch.empty(5).sum()
    finally:
        watcher.close()
    return Trace(**tracer.trace_data()), lines


def test_records_name_their_fields_and_survive_the_json_round_trip(tmp_path):
    trace, lines = _traced_step()
    assert trace.ops and all(type(record) is OpRecord for record in trace.ops)
    # torch.ones(3, 4), made before the model's first forward, is setup
    assert [record.op for record in trace.ops if record.phase == SETUP] == ["aten.ones.default"]
    assert {record.phase for record in trace.ops} == {SETUP, FORWARD, BACKWARD, OPTIMIZER}
    addmm = next(record for record in trace.ops if record.op == "aten.addmm.default")
    assert addmm.path.endswith("test_dynamic_trace_format.py") and addmm.line == lines["forward"]
    assert (addmm.module, addmm.step, list(addmm.out_meta)) == ("model", 1, ["float32[3, 2]"])  # the variable's name
    assert len(addmm.inputs) == 3 and len(addmm.outputs) == 1 and not addmm.seeded
    assert any(record.seeded and record.line == lines["forward"] for record in trace.ops)  # dropout draws
    [allocate, read_empty] = [record for record in trace.ops if record.line == lines["empty"]]
    assert read_empty.inputs == (UNINIT,)
    [(position, origin, allocation)] = read_empty.leaves
    assert (position, origin, trace.ops[allocation]) == (0, ALLOCATED, allocate)
    assert allocate.op == "aten.empty.memory_format" and read_empty.op == "aten.sum.default"
    [reseed] = trace.rng_events
    assert type(reseed) is RngEvent
    assert (reseed.call, reseed.line, reseed.step, reseed.before_op) == ("torch.seed", lines["seed"], 1, 0)

    trace.save(tmp_path / "trace.json")
    loaded = Trace.load(tmp_path / "trace.json")
    assert all(type(record) is OpRecord for record in loaded.ops) and type(loaded.rng_events[0]) is RngEvent
    assert loaded.digests == trace.digests
    # JSON has no tuples: sequences come back as lists, with the same contents
    assert [_as_lists(record) for record in loaded.ops] == [_as_lists(record) for record in trace.ops]
    assert loaded.rng_events == trace.rng_events


def _as_lists(value):
    return [_as_lists(item) for item in value] if isinstance(value, (tuple, list)) else value


def test_a_closure_handed_to_step_is_the_steps_forward_and_backward_not_the_optimizer():
    # LBFGS and Lightning's automatic optimization run the forward and backward from inside step()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    inputs = torch.randn(8, 4)

    def closure():
        optimizer.zero_grad()
        loss = model(inputs).square().mean()
        loss.backward()
        return loss

    watcher = TrainingWatcher()
    tracer = OpTracer()
    tracer.attach(watcher)
    try:
        with tracer:
            loss = optimizer.step(closure)
    finally:
        watcher.close()
    trace = Trace(**tracer.trace_data())
    phases = {(record.op, record.phase) for record in trace.ops}
    assert ("aten.addmm.default", FORWARD) in phases
    assert any(phase == BACKWARD for _, phase in phases)
    assert {phase for op, phase in phases if op == "aten.add_.Tensor"} == {OPTIMIZER}  # SGD's update
    assert loss is not None and watcher.steps == 1 and not watcher.in_optimizer


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-recorder", "python-recorder"])
def test_building_the_model_and_data_is_setup_until_training_starts(compiled):
    """Draws made while the model and the data are built are "setup", not step 1's forward."""
    watcher = TrainingWatcher()
    tracer = OpTracer(compiled=compiled)
    tracer.attach(watcher)
    try:
        with tracer:
            model = torch.nn.Linear(4, 1)  # kaiming_uniform_ and uniform_ draw
            data = torch.randn(8, 4)
            model(data).sum().backward()
            after = torch.randn(2)
    finally:
        watcher.close()
    trace = Trace(**tracer.trace_data())
    phases = [(record.op, record.phase) for record in trace.ops]
    built = [op for op, phase in phases if phase == SETUP]
    assert built == ["aten.empty.memory_format"] * 2 + ["aten.uniform_.default"] * 2 + ["aten.randn.default"], phases
    assert phases[len(built)] == ("aten.t.default", FORWARD)  # the Linear's forward: training started
    assert phases[-1] == ("aten.randn.default", FORWARD)
    assert after.shape == (2,)
