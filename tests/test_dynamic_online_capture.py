"""A later repeat keeps, as it runs, what a capture rerun of it would save (record/online_capture.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detaudit.dynamic.compare import trace_format
from detaudit.dynamic.compare.classify import Trace, compare_traces
from detaudit.dynamic.compare.divergence import divergence_of
from detaudit.dynamic.record.online_capture import OnlineCapture, select
from detaudit.dynamic.record.tracer import OpTracer
from detaudit.launch.watcher import StopRun, TrainingWatcher


def train(noise: float, noisy_step: int = 1) -> None:
    """Three steps whose batch ``noisy_step`` (from 0) comes from numpy with
    ``noise`` in it (an external input), the loss read back by Python
    (``tolist``) each step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        batch = torch.from_numpy(np.full((4, 8), noise if step == noisy_step else 0.5, dtype=np.float32))
        optimizer.zero_grad()
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        loss.detach().tolist()


def traced(noise: float, tracer: OpTracer, noisy_step: int = 1) -> Trace:
    watcher = TrainingWatcher(on_step_end=tracer.flush)  # as the bootstrap flushes: once per step
    tracer.attach(watcher)
    try:
        with tracer:
            train(noise, noisy_step)
    except StopRun:
        pass
    finally:
        watcher.close()
    return Trace(**tracer.trace_data())


@pytest.mark.parametrize("device_digests", [False, True], ids=["host digests", "device digests"])
def test_a_later_repeat_keeps_what_a_capture_rerun_saves(tmp_path, device_digests):
    reference = traced(0.5, OpTracer(device_digests=device_digests))  # the runs of one audit digest alike
    reference.save(tmp_path / "trace.json")
    tracer = OpTracer(device_digests=device_digests)
    online = tracer.observer = OnlineCapture(tracer, tmp_path / "trace.json")
    other = traced(0.25, tracer)

    pair = compare_traces(reference, other)
    [cause] = pair.causes
    assert cause.capture_side == "inputs"  # the batch that entered from numpy
    divergence = divergence_of(reference, pair, 1)
    chart = divergence.records_to_measure()
    assert divergence.steps == [2, 3] and len(chart) > 10
    records = sorted({cause.capture_record, *chart})
    sampled = sorted(set(chart) - {cause.capture_record})
    kept = select({"full": online.full, "sampled": online.sampled}, records, sampled)
    assert kept is not None, "a record the parent measures was not kept"
    assert "inputs" in kept[cause.capture_record] and "sampled_from" in kept[sampled[0]]
    assert any(reference.ops[record].op == "Tensor.tolist" for record in sampled)

    rerun = OpTracer(capture_ops=records, sampled_ops=sampled)
    traced(0.25, rerun)
    assert_same_capture(rerun.captured, kept)


def assert_same_capture(saved: dict, kept: dict, *, inputs: bool = True) -> None:
    """``kept`` holds the tensors ``saved`` holds (``inputs=False``: the
    inputs only where the record's cause may be measured on them)."""
    assert saved.keys() == kept.keys()
    for record, entry in saved.items():
        assert entry.keys() == kept[record].keys(), record
        for key, tensors in entry.items():
            if key == "sampled_from":
                assert tensors == kept[record][key]
                continue
            if key == "inputs" and not inputs and not kept[record][key]:
                continue
            assert len(tensors) == len(kept[record][key]), (record, key)
            for a, b in zip(tensors, kept[record][key]):
                assert torch.equal(a, b), (record, key)


@pytest.mark.parametrize("device_digests", [False, True], ids=["host digests", "device digests"])
def test_run_1_keeps_its_first_steps_for_a_pair_that_parts_ways_there(tmp_path, device_digests):
    for noisy_step, covered in ((0, True), (1, False)):  # the chart shows the step that differs and the next
        tracer = OpTracer(device_digests=device_digests)
        first = tracer.observer = OnlineCapture(tracer, None)
        reference = traced(0.5, tracer, noisy_step)
        pair = compare_traces(reference, traced(0.25, OpTracer(device_digests=device_digests), noisy_step))
        [cause] = pair.causes
        chart = divergence_of(reference, pair, 1).records_to_measure()
        records = sorted({cause.capture_record, *chart})
        sampled = sorted(set(chart) - {cause.capture_record})
        kept = select({"full": first.full, "sampled": first.sampled}, records, sampled)
        if not covered:  # its third step is not kept: run 1 is rerun for it
            assert kept is None and first.ended
            continue
        assert kept is not None
        rerun = OpTracer(capture_ops=records, sampled_ops=sampled)
        traced(0.5, rerun, noisy_step)
        assert_same_capture(rerun.captured, kept, inputs=False)


def test_a_repeat_equal_to_the_reference_keeps_nothing(tmp_path):
    traced(0.5, OpTracer()).save(tmp_path / "trace.json")
    tracer = OpTracer()
    online = tracer.observer = OnlineCapture(tracer, tmp_path / "trace.json")
    traced(0.5, tracer)
    assert online.full == {} and online.sampled == {} and not online.ended


def test_a_long_run_holds_its_last_step_and_a_line_of_the_reference_not_the_traces(tmp_path, monkeypatch):
    """The bootstrap's way (``Tracing``): records go to trace.json at each step
    end, and the reference is read as the repeat reaches it.  What is written
    and kept is what a run that held everything writes and keeps."""
    monkeypatch.setattr(trace_format, "_ROWS_PER_LINE", 8)  # a reference of many lines
    traced(0.5, OpTracer()).save(tmp_path / "reference.json")
    held_everything = OpTracer()
    whole = held_everything.observer = OnlineCapture(held_everything, tmp_path / "reference.json")
    expected = traced(0.25, held_everything)

    tracer = OpTracer()
    tracer.stream_to(tmp_path / "trace.json")
    streamed = tracer.observer = OnlineCapture(tracer, tmp_path / "reference.json")
    held = []  # at each step end: (records held, reference records held)

    def step_end():
        tracer.write_settled()
        held.append((sum(record is not None for record in tracer.records), len(streamed._reference)))

    watcher = TrainingWatcher(on_step_end=step_end)
    tracer.attach(watcher)
    try:
        with tracer:
            train(0.25)
    finally:
        watcher.close()
    assert not (tmp_path / "trace.json").exists()  # whole or not at all: it appears at save
    tracer.save(tmp_path)

    written = Trace.load(tmp_path / "trace.json")
    assert [list(map(_as_lists, record)) for record in written.ops] == [
        list(map(_as_lists, record)) for record in expected.ops
    ]
    assert written.digests == expected.digests and written.final == expected.final
    assert len(held) == 3 and all(records == 0 for records, _ in held), "a step's records stay after it ended"
    assert all(reference <= 8 for _, reference in held), "more of the reference is held than the line read ahead"
    assert streamed.full.keys() == whole.full.keys() and streamed.sampled.keys() == whole.sampled.keys()
    assert streamed.full and streamed.sampled


def _as_lists(value):
    return [_as_lists(item) for item in value] if isinstance(value, (tuple, list)) else value
