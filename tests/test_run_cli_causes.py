"""Every root-cause kind, on a real fixture script: verdict, kind, op and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from detaudit.cli import main
from detaudit.dynamic.compare.causes import CAUSE_KINDS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dynamic"

CASES = [
    # fixture, extra args, kind, op prefix, line, module, what else the cause says
    ("rng_reseed.py", [], "rng", "aten.bernoulli", 14, "model.1", {"call": "torch.seed", "line": 10}),
    # one reseed, two draws at the model's line (normal_ and uniform_): one cause, in setup, naming the other draw
    ("rng_reseed_model.py", [], "rng", "aten.normal_", 9, "", {"call": "torch.seed", "line": 8, "also": [
        "aten.uniform_.default at fixtures/dynamic/rng_reseed_model.py:9"]}),
    # never seeded: the data, the weights and the masks drawn after a restored state are one cause, at the first draw
    ("unseeded_state_restored.py", ["--no-seed", "--repeats", "2"], "rng", "aten.randn", 10, "", {"also": [
        "aten.uniform_.default at fixtures/dynamic/unseeded_state_restored.py:11",
        "aten.bernoulli_.float at fixtures/dynamic/unseeded_state_restored.py:18"]}),
    ("uninitialized_bias.py", [], "uninitialized-memory", "aten.empty", 11, "", {}),
    ("external_numpy.py", [], "external-input", "aten.lift_fresh", 13, "", {}),
    ("control_flow_pid.py", [], "control-flow", "aten.randn", 14, "", {"op": "aten.randn.default", "line": 14}),
    ("thread_sum.py", ["--vary", "threads", "--repeats", "3"], "thread-count", "aten.sum", 11, "", {}),
    ("hash_order_vocab.py", ["--vary", "hashseed", "--repeats", "3"], "hash-order", "aten.lift_fresh", 8, "", {}),
]


@pytest.mark.parametrize("fixture, extra, kind, op, line, module, details", CASES, ids=[c[2] for c in CASES])
def test_root_cause_kind_op_and_line(capsys, fixture, extra, kind, op, line, module, details):
    args = ["run", str(FIXTURES / fixture), "--format", "json", *(extra or ["--repeats", "2"])]
    code = main(args)
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["verdict"] == "nondeterministic"
    [cause] = report["root_causes"]
    assert (cause["kind"], cause["line"], cause["module"]) == (kind, line, module)
    assert cause["op"].startswith(op)
    assert cause["path"].endswith(fixture)
    # the RNG cause names where the generator state was changed; control flow, what the other run did
    assert {key: cause.get("other_side", {}).get(key) for key in details} == details
    assert report["tensors"], "a root cause must show in the final state too"


@pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() == "DEFAULT", reason="this CPU has no vector instructions beyond the default"
)
def test_a_kernel_that_rounds_per_instruction_set_is_a_cpu_capability_cause(capsys):
    fixture = "cpu_capability_randn.py"
    code = main(["run", str(FIXTURES / fixture), "--vary", "cpu-capability", "--repeats", "3", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["verdict"] == "nondeterministic"
    [cause] = report["root_causes"]  # the vectorized normal sampler, where the weights are drawn
    assert (cause["kind"], cause["code"], cause["op"], cause["line"]) == ("cpu-capability", "DYN011", "aten.randn.default", 7)
    assert report["variation"] == {"vary": "cpu-capability", "settings": [None, None, "default"], "in_effect": [None, None, "default"]}
    capabilities = report["environment_differences"]["torch.backends.cpu.get_cpu_capability"]
    assert capabilities[0] == capabilities[1] != "DEFAULT" and capabilities[2] == "DEFAULT"
    assert report["tensors"]


def test_thread_sum_is_deterministic_when_threads_are_not_varied(capsys):
    code = main(["run", str(FIXTURES / "thread_sum.py"), "--repeats", "2", "--format", "json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["verdict"] == "deterministic"


def test_a_python_value_passed_to_an_op_is_its_own_kind(capsys, monkeypatch):
    # hash(str) % 64 picks the row: each child draws its PYTHONHASHSEED unless the environment pins one
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    code = main(["run", str(FIXTURES / "hash_bucket.py"), "--repeats", "2", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    [cause] = report["root_causes"]
    assert code == 1 and (cause["kind"], cause["code"], cause["line"]) == ("python-value", "DYN008", 13)
    assert cause["op"] == "aten.select.int" and cause["max_abs_diff"] > 0  # the rows it selected differ


def test_every_root_cause_in_json_carries_the_hint_the_text_prints(capsys):
    code = main(["run", str(FIXTURES / "rng_reseed.py"), "--repeats", "2", "--format", "json"])
    [cause] = json.loads(capsys.readouterr().out)["root_causes"]
    assert code == 1 and cause["kind"] == "rng"
    assert cause["hint"] == CAUSE_KINDS["rng"].fix_hint  # a kind without a hint of its own: the kind's
