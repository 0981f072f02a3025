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


def _shipped() -> dict:
    return json.loads(SHIPPED_TABLE.read_text())


# (label, edit of the shipped table, the start of the message: JSON path and problem)
BROKEN = [
    ("schema newer", lambda d: d.update(schema_version=2), "schema_version: 2 is newer than this detaudit reads (1)"),
    ("kind unknown", lambda d: d["ops"][0].update(kind="weird"),
     "ops[0].kind: 'weird' is not one of kernel, sample-mixing, random (op 'matmul')"),
    ("remedy unknown", lambda d: d["ops"][0]["remedies"].append("no-such-remedy"),
     "ops[0].remedies[5]: unknown remedy 'no-such-remedy' (op 'matmul')"),
    ("device unknown", lambda d: d["ops"][0]["behaviours"][0].update(devices=["tpu"]),
     "ops[0].behaviours[0].devices[0]: 'tpu' is not one of cpu, cuda (op 'matmul')"),
    ("remedy without cost", lambda d: d["remedies"][0].pop("cost"), "remedies[0]: missing 'cost'"),
    ("empty object", lambda d: d.clear(), "top level: missing 'schema_version', 'torch_versions'"),
    ("unknown top-level key", lambda d: d.update(comment="x"), "top level: unknown key 'comment'"),
    ("range without operator", lambda d: d.update(torch_versions="2.0"), "torch_versions: '2.0' is not a version clause"),
    ("ops empty", lambda d: d.update(ops=[]), "ops: expected a non-empty list"),
    ("aten blank", lambda d: d["ops"][1]["aten"].__setitem__(1, " "), "ops[1].aten[1]: expected a non-empty string (op 'convolution')"),
    ("evidence unknown", lambda d: d["ops"][2]["behaviours"][0].update(evidence="blog"),
     "ops[2].behaviours[0].evidence: 'blog' is not one of measured, sources (op 'attention')"),
    ("markers a string", lambda d: d["remedies"][3].update(markers="VLLM"), "remedies[3].markers: expected a non-empty list"),
    ("remedy id twice", lambda d: d["remedies"].append(copy.deepcopy(d["remedies"][0])),
     "remedies[10].id: duplicate id 'fixed-batch-size'"),
    ("op id twice", lambda d: d["ops"].append(copy.deepcopy(d["ops"][0])), "ops[6].id: duplicate id 'matmul'"),
]  # fmt: skip


@pytest.mark.parametrize("label, change, expected", BROKEN, ids=[case[0] for case in BROKEN])
def test_a_broken_table_is_one_line_naming_the_json_path(label, change, expected):
    data = _shipped()
    change(data)
    with pytest.raises(BatchOpsTableError) as raised:
        parse_table(data, "t.json")
    message = str(raised.value)
    assert message.startswith(f"bad batch-variant ops table t.json: {expected}"), message
    assert "\n" not in message


def test_a_table_file_is_named_in_its_errors(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": 1,')
    with pytest.raises(BatchOpsTableError, match=rf"batch-variant ops table {broken} is not valid JSON: .* line 1"):
        load_batch_ops_table(str(broken))
    edited = _shipped()
    edited["ops"][0]["kind"] = "weird"
    custom = tmp_path / "custom.json"
    custom.write_text(json.dumps(edited))
    with pytest.raises(BatchOpsTableError, match=rf"^bad batch-variant ops table {custom}: ops\[0\]\.kind: "):
        load_batch_ops_table(str(custom))


def test_loading_it_imports_neither_torch_nor_numpy():
    code = (
        "import sys; from detaudit.knowledge.batch_ops import load_batch_ops_table; load_batch_ops_table().hint('aten.mm.default'); "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
