"""The batch-variant ops table: schema, real aten names, hints per device."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from detaudit.knowledge.batch_ops import (
    SHIPPED_TABLE,
    BatchOpsTableError,
    load_batch_ops_table,
    parse_table,
)

TABLE = load_batch_ops_table()


def test_every_aten_name_is_an_op_of_this_torch_and_belongs_to_one_entry():
    seen = {}
    for entry in TABLE.ops:
        for name in entry.aten:
            namespace, function, overload = name.split(".")
            assert namespace == "aten"
            assert hasattr(getattr(torch.ops.aten, function), overload), f"{name} is not an op of torch {torch.__version__}"
            assert name not in seen, f"{name} in both {seen[name]} and {entry.id}"
            seen[name] = entry.id


def test_every_entry_explains_each_device_and_offers_a_remedy_there():
    for entry in TABLE.ops:
        assert entry.kind in ("kernel", "sample-mixing", "random")
        for device in ("cpu", "cuda"):
            assert entry.why(device), (entry.id, device)
            assert [r for r in entry.remedies if device in r.devices], (entry.id, device)
        assert {b.evidence for b in entry.behaviours} <= {"measured", "sources"}
    assert all(remedy.cost and remedy.source for remedy in TABLE.remedies)


def test_hints_are_per_device():
    why_cpu, fixes_cpu = TABLE.explain("aten.mm.default", "cpu")
    why_cuda, fixes_cuda = TABLE.explain("aten.mm.default", "cuda")
    assert "MKL" in why_cpu and "cuBLAS" not in why_cpu
    assert "split-K" in why_cuda and any("allow_bf16_reduced_precision_reduction" in fix for fix in fixes_cuda)
    assert all("cost:" in fix for fix in fixes_cpu + fixes_cuda)
    assert TABLE.explain("aten.add.Tensor", "cpu") == ("", [])
    assert TABLE.hint("aten.native_batch_norm.default").startswith("BatchNorm in training mode")
    assert TABLE.lookup_aten("aten._scaled_dot_product_flash_attention_for_cpu.default").id == "attention"


def test_invariance_markers_come_from_the_remedies():
    markers = TABLE.invariance_markers()
    assert {"VLLM_BATCH_INVARIANT", "set_batch_invariant_mode", "torch._inductor.config.batch_invariant"} <= markers


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda data: data.update(schema_version=2), "schema_version must be 1"),
        (lambda data: data["ops"][0].update(kind="weird"), "kind must be one of"),
        (lambda data: data["ops"][0]["remedies"].append("no-such-remedy"), "unknown remedy 'no-such-remedy'"),
        (lambda data: data["ops"][0]["behaviours"][0].update(devices=["tpu"]), "unknown device 'tpu'"),
        (lambda data: data["remedies"][0].pop("cost"), "missing or wrong field 'cost'"),
    ],
)
def test_a_broken_table_is_one_line(change, message):
    data = copy.deepcopy(json.loads(SHIPPED_TABLE.read_text()))
    change(data)
    with pytest.raises(BatchOpsTableError, match=message):
        parse_table(data)


def test_loading_it_imports_neither_torch_nor_numpy():
    code = (
        "import sys; from detaudit.knowledge.batch_ops import load_batch_ops_table; load_batch_ops_table().hint('aten.mm.default'); "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
