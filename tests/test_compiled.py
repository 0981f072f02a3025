"""`detaudit run` on torch.compile'd code: graphs run compiled (Inductor's
C++ backend on CPU), each call traced at its inputs and outputs; a differing
graph is bisected to its first departing node.

Each fixture case is first checked by plain runs (the final parameters'
bytes), so what the audit reports is there without detaudit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from detaudit.dynamic.runner import audit_script
from detaudit.dynamic.verdict.compiled import compiled_warnings, describe_inside_graph

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "compiled" / "compiled_training.py"
SOURCE = FIXTURE.read_text().splitlines()


def _line_of(text: str) -> int:
    return next(number for number, line in enumerate(SOURCE, 1) if text in line)


def _plain_digests(case: str, runs: int = 2, **env) -> set[str]:
    """The final parameters' digests of plain compiled runs of the fixture."""
    return {
        subprocess.run(
            [sys.executable, str(FIXTURE), "--case", case, "--steps", "2"], capture_output=True, text=True,
            check=True, env={**os.environ, **env},
        ).stdout.split()[-1]
        for _ in range(runs)
    }


def _audit(case: str, tmp_path, **options):
    return audit_script(str(FIXTURE), ["--case", case], steps=2, cwd=str(tmp_path), **options)


def test_a_deterministic_compiled_step_is_deterministic_and_its_graphs_are_counted(tmp_path):
    assert len(_plain_digests("deterministic")) == 1
    report = _audit("deterministic", tmp_path, repeats=2)
    assert report.verdict == "deterministic", report.root_causes
    # one forward and one backward graph, each called once per step
    assert (report.compiled["graphs"], report.compiled["calls"]) == (2, 4)
    assert [graph["kind"] for graph in report.compiled["graph_table"]] == ["forward", "backward"]
    assert report.to_dict()["compiled"]["calls"] == 4
    assert not any("ran eagerly" in warning for warning in report.warnings)


def test_a_nondeterministic_kernel_inside_a_graph_is_named_by_the_bisection(tmp_path):
    assert len(_plain_digests("noisy-op")) == 2  # fault injection: the custom op draws from the OS each call
    report = _audit("noisy-op", tmp_path, repeats=2)
    assert report.verdict == "nondeterministic"
    cause = report.root_causes[0]
    assert (cause.kind.name, cause.op, cause.phase) == ("nondeterministic-op", "inductor.graph_0.forward", "forward")
    inside = cause.inside_graph
    assert inside["reproduced"] and inside["against"] == "replay"
    assert inside["op"] == "detaudit_fixture.jitter.default"
    # not the dropout before it: each replay draws from the same generator state
    assert (inside["line"], inside["path"]) == (_line_of("torch.ops.detaudit_fixture.jitter("), str(FIXTURE))
    assert inside["compiles"] < inside["nodes"]  # a bisection, not a node-by-node walk
    assert "Inside the graph, the first node where two compiled replays" in cause.message()


def test_a_graph_break_gives_two_graphs_each_traced_and_the_break_is_reported(tmp_path):
    assert len(_plain_digests("graph-break")) == 1
    report = _audit("graph-break", tmp_path, repeats=2)
    assert report.verdict == "deterministic"
    graphs = report.compiled["graph_table"]
    assert sorted(graph["kind"] for graph in graphs) == ["backward", "backward", "forward", "forward"]
    assert report.compiled["calls"] == 8
    # the graph before the break holds the LayerNorm, the one after it the second Linear
    modules = {graph["name"]: graph["modules"] for graph in graphs if graph["kind"] == "forward"}
    assert sorted(map(tuple, modules.values())) == [("fc1", "norm"), ("fc2",)]
    assert [entry["count"] for entry in report.compiled["graph_breaks"]] == [1]
    assert any("1 graph break:" in warning and "graph_break()" in warning and "fullgraph=True" in warning
               for warning in report.warnings)


def test_a_compiled_function_that_calls_the_model_is_one_graph_as_in_a_plain_run(tmp_path):
    # the watcher's module hooks stand aside while dynamo traces: inlined, they broke the graph at each module
    report = _audit("compiled-function", tmp_path, repeats=2)
    assert report.verdict == "deterministic" and report.compiled["graph_breaks"] == []
    [forward] = [graph for graph in report.compiled["graph_table"] if graph["kind"] == "forward"]
    assert forward["modules"] == ["model", "model.fc1", "model.fc2", "model.norm"]


def test_graphs_recompiled_for_symbolic_sizes_are_marked_and_warned_about(tmp_path):
    assert len(_plain_digests("dynamic-shapes")) == 1
    report = _audit("dynamic-shapes", tmp_path, repeats=2)
    assert report.verdict == "deterministic"
    graphs = report.compiled["graph_table"]
    # the first step's graphs are static; the shorter batch recompiled both for symbolic sizes
    assert sorted((graph["kind"], graph["dynamic"]) for graph in graphs) == [
        ("backward", False), ("backward", True), ("forward", False), ("forward", True)
    ]
    [warning] = [warning for warning in report.warnings if "symbolic sizes" in warning]
    assert warning.startswith("2 graphs compiled for symbolic sizes") and "dynamic=False" in warning


def test_against_an_eager_reference_the_compiled_layernorm_is_named(tmp_path, monkeypatch):
    eager = _plain_digests("deterministic", runs=1, TORCH_COMPILE_DISABLE="1")
    assert eager != _plain_digests("deterministic", runs=1)  # compiled and eager part, in plain runs too
    reference = tmp_path / "eager-ref"
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    saved = _audit("deterministic", tmp_path, repeats=2, save_reference=str(reference))
    assert saved.compiled is None and any("compilation is disabled" in warning for warning in saved.warnings)
    monkeypatch.delenv("TORCH_COMPILE_DISABLE")
    report = _audit("deterministic", tmp_path, repeats=1, against=str(reference))
    assert report.verdict == "drift"
    [cause] = report.root_causes
    assert (cause.kind.name, cause.op) == ("compiled-vs-eager", "inductor.graph_0.forward")
    inside = cause.inside_graph
    assert inside["against"] == "eager" and inside["op"] == "aten.var_mean.correction"
    assert (inside["line"], inside["module"]) == (_line_of("h = self.norm(self.fc1(x))"), "norm")


def test_eager_runs_compiled_regions_op_by_op_and_says_so(tmp_path):
    report = _audit("deterministic", tmp_path, repeats=2, eager=True)
    assert report.verdict == "deterministic" and report.compiled is None
    assert any("ran eagerly (--eager)" in warning for warning in report.warnings)


def test_warnings_name_graph_breaks_autotuning_and_a_backend_other_than_inductor():
    calls = [{"call": "torch.compile", "path": "train.py", "line": 3}]
    graph = {"name": "inductor.graph_0.forward", "autotune": ["max_autotune"], "inductor_deterministic": False}
    tuned = {"compile_calls": calls, "compiled": {"graphs": 1, "calls": 2, "graph_breaks": [], "graph_table": [graph]}}
    [warning] = compiled_warnings(tuned, eager=False)
    assert "1 graph compiled with max_autotune" in warning and "DET017" in warning
    deterministic = {**graph, "inductor_deterministic": True}
    assert compiled_warnings({**tuned, "compiled": {**tuned["compiled"], "graph_table": [deterministic]}}, eager=False) == []
    other_backend = {"compile_calls": calls, "compiled": {"graphs": 0, "calls": 0, "graph_breaks": [], "graph_table": []}}
    assert "no graph ran through Inductor" in compiled_warnings(other_backend, eager=False)[0]


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        ({"error": "NotImplementedError: x"}, "could not finish: NotImplementedError: x"),
        ({"against": "replay", "reproduced": False, "compiles": 1, "nodes": 3}, "two compiled runs of the graph agreed"),
        ({"against": "eager", "reproduced": True, "op": "aten.mm.default", "node": "mm", "path": "t.py", "line": 4,
          "module": "fc", "max_abs_diff": 1e-7, "compiles": 3, "nodes": 9},
         "departs from its ops run eagerly: aten.mm.default (mm) at t.py:4 in fc, max |diff| 1e-07; bisected over 9 nodes"),
    ],
)
def test_what_a_bisection_found_reads_as_a_sentence(found, expected):
    assert expected in describe_inside_graph(found)


def test_a_compiled_forward_hands_back_inputs_with_the_digests_they_already_have():
    import torch
    from torch import nn

    from detaudit.dynamic.record.tracer import OpTracer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 2))
    compiled = torch.compile(model)
    x = torch.randn(64, 8)
    with OpTracer(trace_compiled=True) as tracer:
        compiled(x).sum().backward()
    trace = tracer.trace_data()
    [forward] = [record for record in trace["ops"] if record.op.endswith(".forward")]
    # AOTAutograd's forward returns, beside its result, what its backward reads: the
    # input and weights themselves among them, digested once, as inputs
    handed_back = set(forward.outputs) & set(forward.inputs)
    assert len(handed_back) >= 2
    assert {trace["digests"][i] for i in handed_back} <= {tracer.digest(t) for t in [x, *model.parameters()]}


def test_against_an_eager_reference_a_compiled_dropout_is_named_with_what_makes_it_draw_as_eager(tmp_path, monkeypatch):
    reference = tmp_path / "eager-ref"
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    _audit("dropout", tmp_path, repeats=2, save_reference=str(reference))
    monkeypatch.delenv("TORCH_COMPILE_DISABLE")
    report = _audit("dropout", tmp_path, repeats=1, against=str(reference))
    assert report.verdict == "drift"
    [cause] = report.root_causes
    inside = cause.inside_graph
    assert cause.kind.name == "compiled-vs-eager" and inside["seeded"]
    assert inside["line"] == _line_of("x = torch.nn.functional.dropout(x, 0.2, training=True)")
    assert "fallback_random = True" in cause.message()




@torch.library.custom_op("detaudit_tests::jitter", mutates_args=())
def _jitter(x: torch.Tensor) -> torch.Tensor:
    """x, nudged by a number the OS draws at each call (the fixture's op, for in-process audits)."""
    return x * (1 + int.from_bytes(os.urandom(2), "little") * 2**-30)


_jitter.register_fake(lambda x: torch.empty_like(x))
_jitter.register_autograd(lambda ctx, grad: grad)


def _in_process_step(noisy: bool):
    """A compiled training step for detaudit.audit, compiled afresh in each repeat (a new model);
    ``noisy``: the jitter op inside the compiled forward."""

    def step():
        model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def forward(x):
            h = model(x)
            return torch.ops.detaudit_tests.jitter(h) if noisy else h

        compiled = torch.compile(forward)
        for _ in range(2):
            optimizer.zero_grad()
            compiled(torch.randn(16, 8)).pow(2).sum().backward()
            optimizer.step()
        return model

    return step


def test_an_in_process_audit_runs_compiled_regions_compiled():
    import detaudit

    report = detaudit.audit(_in_process_step(noisy=False), repeats=2)
    assert report.verdict == "deterministic"
    assert (report.compiled["graphs"], report.compiled["calls"]) == (2, 4)
    noisy = detaudit.audit(_in_process_step(noisy=True), repeats=2)
    assert noisy.verdict == "nondeterministic"
    # the graph call, not the op inside it: compiled code ran compiled, as detaudit run audits it
    assert (noisy.root_causes[0].kind.name, noisy.root_causes[0].op) == ("nondeterministic-op", "inductor.graph_0.forward")


def test_a_graph_compiled_before_the_audit_is_traced_at_its_boundary_all_the_same():
    import detaudit

    torch.manual_seed(0)
    compiled = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
    x = torch.randn(4, 8)
    compiled(x)  # compiled here, before any tracer's hooks
    report = detaudit.audit(lambda: {"out": torch.ops.detaudit_tests.jitter(compiled(x))}, repeats=2)
    assert [graph["kind"] for graph in report.compiled["graph_table"]] == ["call"]
    assert report.root_causes[0].op == "detaudit_tests.jitter.default"  # the graph's outputs agreed: it was traced
