"""State comparison and the tracer's digest: exact, position-sensitive, every dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detaudit.dynamic.compare.classify import Trace, compare_traces
from detaudit.dynamic.compare.state_diff import SavedState, compare_saved_states, tensor_diff
from detaudit.dynamic.record.final_state import state_digests
from detaudit.dynamic.record.tracer import OpTracer


def test_tensor_diff_measures_abs_rel_ulp_and_fraction():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = a.clone()
    b[1] = float(np.nextafter(np.float32(2.0), np.float32(3.0)))
    b[3] = 4.5
    diff = tensor_diff("x", a, b)
    assert diff.fraction_differing == 0.5
    assert diff.max_abs_diff == 0.5 and diff.max_rel_diff == 0.125
    assert diff.max_ulp == (4.5 - 4.0) / float(np.spacing(np.float32(4.0)))
    assert tensor_diff("x", a, a.clone()) is None


def test_another_precision_is_compared_rounded_to_the_narrower_dtype():
    wide = torch.tensor([1.0, 1.0 + 2.0**-30, 3.0], dtype=torch.float64)  # 1 + 2^-30 rounds to 1.0 in float32
    narrow = torch.tensor([1.0, 1.0, 3.0 + 2.0**-22], dtype=torch.float32)  # one float32 ULP above 3.0
    diff = tensor_diff("w", wide, narrow)
    assert diff.dtype == "float64->float32" and diff.fraction_differing == 1 / 3 and diff.max_ulp == 1
    assert tensor_diff("w", wide, wide.float()) is None  # exactly its rounding: no difference
    assert tensor_diff("w", wide, torch.zeros(2)).max_abs_diff == float("inf")  # another shape: never close
    assert tensor_diff("w", wide, wide.long()).max_abs_diff == float("inf")  # an integer: not a precision


def test_tolerance_reads_ulp_or_a_relative_difference_and_judges_final_tensors():
    from detaudit.dynamic.verdict.tolerance import Tolerance

    assert Tolerance.parse("4ulp") == Tolerance(ulp=4) and Tolerance.parse(" 4 ULP") == Tolerance(ulp=4)
    assert Tolerance.parse("1e-6") == Tolerance(rel=1e-6)
    for bad in ("ulp", "-1e-6", "nan", "4.5ulp", "four"):
        with pytest.raises(ValueError):
            Tolerance.parse(bad)
    close = {"dtype": "float32", "max_ulp": 3, "max_rel_diff": 1e-7, "max_abs_diff": 1e-7}
    assert Tolerance(ulp=4).allows(close) and not Tolerance(ulp=2).allows(close)
    assert Tolerance(rel=1e-6).allows(close) and not Tolerance(rel=1e-8).allows(close)
    assert not Tolerance(ulp=10**9).allows({**close, "dtype": "int64", "max_ulp": 0})  # a step count is never close
    assert not Tolerance(rel=1.0).allows({**close, "max_abs_diff": float("inf")})  # a tensor one side lacks


def test_negative_zero_differs_and_missing_tensor_is_reported():
    assert tensor_diff("z", torch.tensor([0.0]), torch.tensor([-0.0])).fraction_differing == 1.0  # bits, not values
    diffs = compare_saved_states(
        SavedState.of_tensors({"a": torch.zeros(2)}), SavedState.of_tensors({"a": torch.zeros(2), "b": torch.ones(1)})
    )
    assert [d.name for d in diffs] == ["b"]


def test_saved_states_are_compared_by_digest_and_loaded_only_where_they_differ():
    loads = []

    def saved(tensors: dict) -> SavedState:
        return SavedState(state_digests(tensors), lambda: loads.append(sorted(tensors)) or tensors)

    same = {"w": torch.arange(6.0).reshape(2, 3), "step": torch.tensor(3)}
    assert compare_saved_states(saved(same), saved({k: v.clone() for k, v in same.items()})) == []
    assert loads == []  # equal digests: nothing loaded
    changed = {**same, "w": same["w"].clone()}
    changed["w"][1, 2] = torch.nextafter(changed["w"][1, 2], torch.tensor(10.0))
    [diff] = compare_saved_states(saved(same), saved(changed))
    assert (diff.name, diff.fraction_differing) == ("w", 1 / 6) and diff.max_ulp == 1
    assert len(loads) == 2  # each side loaded once for the differing tensor
    [missing] = compare_saved_states(saved(same), saved({**same, "extra": torch.ones(4)}))
    assert (missing.name, missing.shape, missing.dtype) == ("extra", [4], "missing in one run")


def _digests(tensor: torch.Tensor, device_path: bool = False) -> int:
    tracer = OpTracer()
    if device_path:  # the non-CPU digest's arithmetic, run on CPU: staged, then flushed in one transfer
        tracer._staged.append(tracer._device_digests.digest(tensor))
        tracer.flush()
        return tracer.digests[0]
    digest_id = tracer._stage_digest(tensor)
    tracer.flush()
    return tracer.digests[digest_id]


@pytest.mark.parametrize("device_path", [False, True], ids=["cpu-crc", "device-weighted-sum"])
def test_digest_sees_permutations_equal_pairs_and_every_dtype(device_path):
    def digest(tensor):
        return _digests(tensor, device_path)

    base = torch.arange(8, dtype=torch.float32)
    assert digest(base) == digest(base.clone())
    assert digest(base) != digest(base.flip(0))  # XOR hashes are blind to this
    assert digest(torch.tensor([3.0, 3.0])) != digest(torch.tensor([5.0, 5.0]))  # x ^ x == 0
    grid = torch.arange(6.0).reshape(2, 3)
    assert digest(grid.t()) == digest(grid.t().contiguous()) != digest(grid)  # logical order, not memory order
    for dtype in (torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.bfloat16, torch.float16,
                  torch.complex64, torch.uint16, torch.float8_e4m3fn):
        values = torch.tensor([1, 0, 1, 1]).to(dtype)
        changed = values.clone()
        changed[1] = 1
        assert digest(values) != digest(changed), dtype
    # past the CPU digest's CRC size: weighted 64-bit words in 2 MiB chunks, then 0-7 tail bytes
    large = torch.arange(2_200_003, dtype=torch.int32).to(torch.int8)
    swapped, tail_changed = large.clone(), large.clone()
    first, second = 5, (1 << 21) + 7  # one in each chunk, holding 5 and 7
    swapped[first], swapped[second] = large[second], large[first]
    tail_changed[-1] += 1
    assert digest(large) == digest(large.clone())
    assert len({digest(large), digest(swapped), digest(tail_changed), digest(large.flip(0))}) == 4


def _trace(step) -> Trace:
    tracer = OpTracer()
    with tracer:
        step()
    return Trace(**tracer.trace_data())


def test_compare_finds_the_op_whose_inputs_match_and_skips_allocations():
    torch.manual_seed(0)
    weights = torch.randn(4, 4)

    def step(bump):
        torch.empty(64)  # garbage, never compared
        hidden = weights @ weights
        nudged = hidden + torch.tensor(bump)  # a Python value entering torch
        return nudged.relu().sum()

    same = compare_traces(_trace(lambda: step(0.0)), _trace(lambda: step(0.0)))
    assert same.causes == [] and same.propagated == 0
    different = compare_traces(_trace(lambda: step(0.0)), _trace(lambda: step(1.0)))
    assert [c.kind for c in different.causes] == ["external-input"]
    assert different.propagated >= 2  # add, relu, sum only differ because of it


def test_reading_a_transposed_or_expanded_view_reuses_its_inputs_digest():
    weight, data = torch.randn(3, 4), torch.randn(3, 5)
    tracer = OpTracer()
    with tracer:
        weight.t() @ data  # t: a view; mm reads it without hashing a strided copy
        weight.sum(0).expand(5, 4).sum()
    # weight, data and mm's output; weight.sum(0) and the final sum: nothing for the views
    assert len(tracer.trace_data()["digests"]) == 5


def test_tracer_forgets_freed_storages_and_restores_the_garbage_collector():
    import gc

    values = torch.ones(4)
    tracer = OpTracer()
    with tracer:
        assert gc.get_freeze_count() > 0  # what existed before tracing is not walked by collections
        for _ in range(6000):
            values = values + 1  # a new storage per op; the previous one is freed
    assert gc.get_freeze_count() == 0
    assert len(tracer.records) == 6000
    # not one entry per op, nor thousands of dead ones: each holds its storage's C++ object among the
    # freed tensor memory, and many fragment the heap (storage_tables.MIN_FORGET_AT)
    assert len(tracer.tables) <= 200
