"""Every localization path of `detaudit run`, proven on CPU by fault injection.

Real CPU nondeterminism reaches only a few kinds of op, so each path makes one
op call give different bits (one ULP, through the test-only
``DETAUDIT_TEST_FAULT``, see detaudit/dynamic/faults/spec.py) in a real training
loop (fixtures/dynamic/localize/) and checks that the report names it as a
root cause: its kind, op, phase, source line and module, with a measured
deviation.  Lines are looked up by the marker comments in the fixtures.

The paths that share a script and its arguments share one audit: with K
faults, run 0 is left alone and run k carries the k-th fault, so the report
must list exactly K causes, each seen in one of the K pairs (a fault that
named the wrong op, or spilled into another cause, changes the set).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest

from detaudit.cli import main
from detaudit.dynamic.faults.spec import FAULT_ENV, FaultSpecError, parse_specs

LOCALIZE = Path(__file__).resolve().parents[1] / "fixtures" / "dynamic" / "localize"


def line_of(script: str, marker: str) -> int:
    """The line of ``script`` that ends with the comment ``# marker``."""
    lines = (LOCALIZE / script).read_text().splitlines()
    [number] = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}")]
    return number


def audit(
    capsys, monkeypatch, script: str, args=(), faults: list[dict] = (), repeats: int = 2, jobs: int = 1, options=()
) -> dict:
    """`detaudit run SCRIPT --steps 1 --format json --jobs N [options]`, the k-th fault injected in run k."""
    if faults:
        monkeypatch.setenv(FAULT_ENV, json.dumps([{**fault, "repeat": k} for k, fault in enumerate(faults, 1)]))
    else:
        monkeypatch.delenv(FAULT_ENV, raising=False)
    command = ["run", str(LOCALIZE / script), "--steps", "1", "--repeats", str(repeats), "--timeout", "300"]
    command += ["--jobs", str(jobs)]
    command += ["--format", "json", "--strict", *options]  # --strict: a latent difference is localized and fails too
    code = main([*command, "--", *args] if args else command)
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == (0 if report.get("verdict") == "deterministic" else 1), captured.err
    return report


def only_cause(report: dict) -> dict:
    assert report["verdict"] == "nondeterministic", report
    assert len(report["root_causes"]) == 1, json.dumps(report["root_causes"], indent=1)
    return report["root_causes"][0]


class Localized(NamedTuple):
    """One localization path: the fault ("line" given as a marker) and what the report must say."""

    name: str
    fault: dict
    op: str
    phase: str
    marker: str  # the line the cause is reported at
    module: str


# (script, script args) -> the paths proven in one audit of it; no two paths of a group share a site
GROUPS = {
    "train-loop": ("train_mlp.py", [], [
        Localized("forward", {"op": "aten.addmm", "line": "fc1-line"},
              "aten.addmm.default", "forward", "fc1-line", "model.fc1"),
        # a backward op is attributed to the forward line (and module) that created its autograd node
        Localized("backward", {"op": "aten.mm", "phase": "backward", "line": "fc2-line"},
              "aten.mm.default", "backward", "fc2-line", "model.fc2"),
        Localized("in-place", {"op": "aten.add_", "line": "inplace-line"},
              "aten.add_.Tensor", "forward", "inplace-line", "model"),
        Localized("op-on-view", {"op": "aten.mul_", "line": "view-line"},
              "aten.mul_.Tensor", "forward", "view-line", "model"),
        Localized("custom-function-forward", {"op": "aten.mul", "line": "custom-forward"},
              "aten.mul.Tensor", "forward", "custom-forward", "model"),
        # the custom backward runs user code: its own line is the site (autograd knows no forward line for it)
        Localized("custom-function-backward", {"op": "aten.add", "phase": "backward", "line": "custom-backward"},
              "aten.add.Tensor", "backward", "custom-backward", ""),
        # a forward hook of model.fc2 runs after fc2's forward returned, inside model's forward
        Localized("forward-hook", {"line": "hook-line"},
              "aten.mul.Tensor", "forward", "hook-line", "model"),
        Localized("gradient-clipping", {"op": "aten._foreach_norm", "line": "clip-line"},
              "aten._foreach_norm.Scalar", "forward", "clip-line", ""),
    ]),
    "fused-adamw-accumulation": ("train_mlp.py", ["--optimizer", "adamw-fused", "--accumulate", "2"], [
        Localized("adamw-fused", {"op": "aten._fused_adamw_"},
              "aten._fused_adamw_.default", "optimizer", "step-line", ""),
        # the second micro-batch's gradients are added into .grad by autograd's AccumulateGrad:
        # no forward line created that node, so the site is the backward() call
        Localized("gradient-accumulation", {"op": "aten.add_", "phase": "backward"},
              "aten.add_.Tensor", "backward", "backward-line", ""),
        Localized("second-micro-batch-forward", {"op": "aten.addmm", "line": "fc1-line", "occurrence": 1},
              "aten.addmm.default", "forward", "fc1-line", "model.fc1"),
    ]),
    "foreach-adam": ("train_mlp.py", ["--optimizer", "adam-foreach"], [
        Localized("adam-foreach", {"op": "aten._foreach_addcdiv_"},
              "aten._foreach_addcdiv_.ScalarList", "optimizer", "step-line", ""),
    ]),
    "checkpoint": ("checkpointed.py", [], [
        # occurrences 0 and 1 are the forward of blocks 0 and 1, 2 is block 1 recomputed in backward
        Localized("checkpoint-recomputation", {"op": "aten.addmm", "line": "block-line", "occurrence": 2},
              "aten.addmm.default", "backward", "block-line", "model.blocks.1"),
    ]),
    "autocast-grad-scaler": ("autocast_scaler.py", [], [
        Localized("autocast-bf16", {"op": "aten.addmm", "line": "forward-line"},
              "aten.addmm.default", "forward", "forward-line", "model.0"),
        Localized("grad-scaler-unscale", {"op": "aten._amp_foreach_non_finite_check_and_unscale_"},
              "aten._amp_foreach_non_finite_check_and_unscale_.default", "forward", "unscale-line", ""),
    ]),
    "channels-last": ("channels_last.py", [], [
        Localized("channels-last-forward", {"op": "aten.convolution"},
              "aten.convolution.default", "forward", "forward-line", "model.0"),
        Localized("channels-last-backward", {"op": "aten.convolution_backward"},
              "aten.convolution_backward.default", "backward", "forward-line", "model.2"),
    ]),
}
FAST = {"train-loop"}


@pytest.mark.parametrize(
    "script, args, paths",
    [pytest.param(*group, id=name, marks=() if name in FAST else pytest.mark.slow) for name, group in GROUPS.items()],
)
def test_each_perturbed_op_is_named_with_its_phase_line_and_module(capsys, monkeypatch, script, args, paths):
    faults = [
        {**path.fault, "line": line_of(script, path.fault["line"])} if "line" in path.fault else path.fault
        for path in paths
    ]
    report = audit(capsys, monkeypatch, script, args, faults, repeats=len(paths) + 1)
    # a one-ULP fault can vanish before the final state (a recomputed activation only decides a
    # ReLU mask in backward): latent, and localized all the same
    assert report["verdict"] in ("nondeterministic", "latent"), report
    expected = {
        path.name: ("nondeterministic-op", path.op, path.phase, line_of(script, path.marker), path.module)
        for path in paths
    }
    found = [(c["kind"], c["op"], c["phase"], c["line"], c["module"]) for c in report["root_causes"]]
    missing = {name: site for name, site in expected.items() if site not in found}
    unexpected = [site for site in found if site not in expected.values()]
    assert not missing and not unexpected, f"not reported: {missing}; reported instead: {unexpected}"
    for cause in report["root_causes"]:
        assert cause["path"].endswith(script)
        assert (cause["first_step"], cause["seen"], cause["pairs"]) == (1, 1, len(paths))
        assert cause["max_abs_diff"] is not None and cause["max_abs_diff"] > 0  # the capture reruns saw the ULP


@pytest.mark.slow
def test_concurrent_runs_give_the_report_of_runs_one_at_a_time(capsys, monkeypatch):
    faults = [{"op": "aten.addmm", "line": line_of("train_mlp.py", "fc1-line")}, {"op": "aten._foreach_norm"}]
    one_at_a_time = audit(capsys, monkeypatch, "train_mlp.py", faults=faults, repeats=3)
    concurrent = audit(capsys, monkeypatch, "train_mlp.py", faults=faults, repeats=3, jobs=3)
    assert len(one_at_a_time["root_causes"]) == 2 and all(c["max_abs_diff"] for c in one_at_a_time["root_causes"])
    assert concurrent == one_at_a_time


def test_a_compiled_model_audited_with_eager_is_localized_as_the_eager_code_it_runs(capsys, monkeypatch):
    # --eager: torch.compile runs the model's Python eagerly under the tracer (docs/compiled.md): a
    # perturbed op inside the compiled module is named like one in eager code
    fault = {"op": "aten.gelu", "line": line_of("compiled.py", "forward-line")}
    cause = only_cause(audit(capsys, monkeypatch, "compiled.py", faults=[fault], options=["--eager"]))
    expected = ("nondeterministic-op", "aten.gelu.default", "forward", line_of("compiled.py", "forward-line"))
    assert (cause["kind"], cause["op"], cause["phase"], cause["line"]) == expected
    assert cause["module"] == "compiled.1"  # the layer inside the compiled module, without the _orig_mod level
    assert cause["max_abs_diff"] > 0


@pytest.mark.slow
def test_an_unseeded_batch_from_dataloader_workers_is_an_external_input(capsys, monkeypatch):
    # the batch is rebuilt from the workers' shared memory without a traced op: it enters the
    # trace where the training step first reads it
    cause = only_cause(audit(capsys, monkeypatch, "loader_workers.py", ["--unseeded-noise"]))
    assert (cause["kind"], cause["line"]) == ("external-input", line_of("loader_workers.py", "forward-line"))
    assert cause["max_abs_diff"] > 0


@pytest.mark.slow
def test_batches_from_dataloader_workers_are_deterministic_when_seeded(capsys, monkeypatch):
    assert audit(capsys, monkeypatch, "loader_workers.py")["verdict"] == "deterministic"


def test_a_fault_that_matches_no_op_changes_nothing(capsys, monkeypatch):
    # the injector only acts on the call it selects: a spec that selects nothing is a plain run
    report = audit(capsys, monkeypatch, "train_mlp.py", faults=[{"op": "aten.no_such_op"}])
    assert report["verdict"] == "deterministic"


def test_fault_specs_one_or_a_list_with_one_per_repeat():
    [spec] = parse_specs('{"op": "aten.mm"}')
    assert spec == {"op": "aten.mm", "repeat": 1, "occurrence": 0, "output": None, "element": 0}
    specs = parse_specs('[{"op": "aten.mm"}, {"line": 3, "repeat": 2}]')
    assert [(s["repeat"], s.get("op"), s.get("line")) for s in specs] == [(1, "aten.mm", None), (2, None, 3)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "is not JSON"),
        ('["aten.mm"]', "must be a JSON object or a list of objects"),
        ('{"repeat": 1}', "must select the op"),
        ('{"op": "aten.mm", "ocurrence": 1}', "unknown key 'ocurrence'"),
        ('[{"op": "aten.mm"}, {"op": "aten.add"}]', "more than one fault for repeat 1"),
    ],
)
def test_a_bad_fault_spec_is_one_clear_error(text, message):
    with pytest.raises(FaultSpecError, match=message):
        parse_specs(text)
