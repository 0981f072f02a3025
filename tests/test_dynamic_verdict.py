"""What counts as a difference, and what fails the gate (issue 11, items 1-5).

Each case is a script in the shape of real training code where an earlier
version of `detaudit run` gave a wrong verdict or extra causes: scratch bytes
nobody reads, a `.item()` downstream of the cause, a batch sampler whose
difference Python carries into the next lines, a metric that differs while
the final state does not, a thread count the script pins itself.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import detaudit
from detaudit.cli import main
from detaudit.dynamic.compare.trace_format import EXTERNAL, UNREAD, Trace
from detaudit.dynamic.record.tracer import OpTracer
from detaudit.dynamic.verdict.run_report import RunReport
from detaudit.runtime.environment import fingerprint
from detaudit.testing import assert_deterministic

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dynamic"


def _run_json(capsys, script, *args) -> tuple[int, dict]:
    code = main(["run", str(script), "--format", "json", *map(str, args)])
    return code, json.loads(capsys.readouterr().out)


def _line_of(script: Path, text: str) -> int:
    [line] = [n for n, source in enumerate(script.read_text().splitlines(), 1) if text in source]
    return line


# -- 1. scratch outputs ------------------------------------------------------------------------------
def test_the_lstm_workspace_is_scratch_its_backward_reads():
    """oneDNN's LSTM forward returns a uint8 workspace that only its backward
    takes, through the argument its schema names `workspace`: that read is not
    a read of data, so the forward's workspace output has no reader."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(16, 16, 1)
    tracer = OpTracer()
    with tracer:
        output, _ = lstm(torch.randn(10, 4, 16))
        output.sum().backward()
    trace = Trace(**tracer.trace_data())
    [forward] = [r for r in trace.ops if r.op == "aten.mkldnn_rnn_layer.default"]
    [backward] = [r for r in trace.ops if r.op == "aten.mkldnn_rnn_layer_backward.default"]
    assert forward.out_meta[-1].startswith("uint8")
    assert backward.inputs[-1] == UNREAD
    workspace = forward.outputs[-1]
    assert not [r.op for r in trace.ops if workspace in r.inputs]


def _step_that_snapshots_a_tensor():
    # copy.deepcopy (Lightning's self.log does it) copies into a storage allocated
    # outside any op: the copy_ that fills it does not read what was there
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 8))
    weight.square().sum().backward()
    return {"weight": weight, "snapshot": copy.deepcopy(weight.detach())}


def test_an_overwritten_argument_is_not_read():
    tracer = OpTracer()
    with tracer:
        snapshot = _step_that_snapshots_a_tensor()["snapshot"]
        torch.add(snapshot, 1, out=torch.empty_like(snapshot))
    trace = Trace(**tracer.trace_data())
    [copy_into_snapshot] = [r for r in trace.ops if r.op == "aten.copy_.default"]
    assert copy_into_snapshot.inputs[0] == UNREAD and copy_into_snapshot.inputs[1] >= 0
    [add_out] = [r for r in trace.ops if r.op == "aten.add.out"]
    assert add_out.inputs[-1] == UNREAD


def test_a_deep_copied_tensor_is_deterministic():
    # was: latent, uninitialized-memory at the deepcopy line
    report = detaudit.audit(_step_that_snapshots_a_tensor, repeats=2)
    assert report.verdict == "deterministic", report.root_causes


def test_uninitialized_memory_only_copied_before_it_is_overwritten_is_not_read(capsys):
    # was: latent, external-input at a view of the storage (torchtitan-style FSDP2 meta init)
    code, report = _run_json(capsys, FIXTURES / "uninitialized_copied_then_initialised.py", "--repeats", "2")
    assert (code, report["verdict"], report["root_causes"]) == (0, "deterministic", [])


def test_the_lstm_word_language_model_is_deterministic(capsys):
    # was: nondeterministic, aten.mkldnn_rnn_layer max |diff| 255, 0 final tensors differ
    code, report = _run_json(capsys, FIXTURES / "lstm_word_lm.py", "--steps", "0", "--repeats", "2")
    assert (code, report["verdict"], report["root_causes"], report["tensors"]) == (0, "deterministic", [], [])


def test_a_race_in_the_lstm_is_measured_on_its_output_not_its_workspace(capsys, monkeypatch):
    """The workspace's unwritten bytes differ too, but only the LSTM's
    backward takes them: the deviation is the output's one ULP, not 255."""
    fault = {"repeat": 1, "op": "aten.mkldnn_rnn_layer.default", "occurrence": 0}
    monkeypatch.setenv("DETAUDIT_TEST_FAULT", json.dumps(fault))
    _, report = _run_json(capsys, FIXTURES / "lstm_word_lm.py", "--steps", "0", "--repeats", "2")
    [cause] = report["root_causes"]
    assert (report["verdict"], cause["op"]) == ("latent", "aten.mkldnn_rnn_layer.default")
    assert 0 < cause["max_abs_diff"] < 1e-6


def _train_with_an_unused_race(log: str | None):
    """A deterministic step that also sums with duplicate indices on 2 threads (a race)."""

    def step():
        torch.set_num_threads(2)
        model = torch.nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(16, 8)).square().mean().backward()
        optimizer.step()
        # 8 floats per index: the race shows in every run (one float per index collides far less often)
        totals = torch.zeros(8, 8).index_put_(
            (torch.randint(0, 8, (400_000,)),), torch.randn(400_000, 8), accumulate=True
        )
        if log == "item":
            print(totals.sum().item())
        elif log == "numpy":  # no aten op reads it: the tracer records the call
            print(totals.numpy().sum())
        return {"model": model}

    return step


def test_an_output_nobody_reads_is_never_reported():
    report = detaudit.audit(_train_with_an_unused_race(log=None), repeats=3)
    assert report.verdict == "deterministic" and report.root_causes == []


def test_python_reads_are_recorded_once_each_and_the_tracers_own_are_not(tmp_path):
    """`from_numpy` makes the tracer digest a new leaf through `numpy()`;
    a user's `numpy()` / `tolist()` pass through the torch function mode
    once more: neither may add a record."""
    import numpy as np

    tracer = OpTracer()
    with tracer:
        batch = torch.from_numpy(np.arange(6, dtype=np.float32))
        batch.numpy(), batch.tolist(), torch.save({"batch": batch}, tmp_path / "batch.pt")
    ops = [record.op for record in Trace(**tracer.trace_data()).ops]
    assert ops == ["aten.lift_fresh.default", "Tensor.numpy", "Tensor.tolist", "torch.save"]


def test_a_storage_argument_is_read_as_an_input_from_outside(tmp_path):
    """`torch.load` makes each tensor with `set_(storage)` on bytes no op
    wrote: those bytes are an input of the record, external where they enter."""
    torch.save({"weights": torch.arange(6.0)}, tmp_path / "weights.pt")
    tracer = OpTracer()
    with tracer:
        torch.load(tmp_path / "weights.pt")["weights"].sum()
    trace = Trace(**tracer.trace_data())
    [(index, record)] = [(i, r) for i, r in enumerate(trace.ops) if r.op.startswith("aten.set_.source_Storage")]
    assert record.inputs[0] == UNREAD and len(record.inputs) == 2
    assert record.leaves == ((1, EXTERNAL, index),)
    assert trace.value(record.inputs[1]) == OpTracer().digest(torch.arange(6.0).view(torch.uint8))


# -- 2. latent differences ------------------------------------------------------------------------------
@pytest.mark.parametrize("log", ["item", "numpy"])
def test_a_difference_python_reads_but_the_final_state_does_not_is_latent(log):
    report = detaudit.audit(_train_with_an_unused_race(log), repeats=3)
    assert report.verdict == "latent" and report.tensors == []
    [cause] = report.root_causes
    assert cause.op.startswith("aten.index_put") and cause.effect == "latent"
    assert report.passed and report.exit_code == 0
    report.strict = True
    assert not report.passed and report.exit_code == 1
    assert report.to_dict()["root_causes"][0]["effect"] == "latent"


def test_assert_deterministic_warns_on_a_latent_difference_and_fails_with_strict():
    step = _train_with_an_unused_race("item")
    with pytest.warns(UserWarning, match="latent"):
        assert_deterministic(step)
    with pytest.raises(AssertionError, match="latent"):
        assert_deterministic(step, strict=True)


def test_latent_exits_1_only_with_strict(capsys):
    script = FIXTURES / "latent_metric.py"
    code, report = _run_json(capsys, script, "--repeats", "2", "--strict")
    assert (code, report["verdict"], report["strict"], report["exit_code"], report["tensors"]) == (
        1,
        "latent",
        True,
        1,
        [],
    )
    [cause] = report["root_causes"]
    assert (cause["effect"], cause["line"]) == ("latent", _line_of(script, "per_bucket = "))


def test_a_cause_that_reaches_the_final_state_fails_without_strict():
    def step():
        torch.set_num_threads(2)
        table = torch.nn.Parameter(torch.randn(8, 8))
        optimizer = torch.optim.SGD([table], lr=0.1)
        (table[torch.randint(0, 8, (400_000,))] * torch.randn(400_000, 8)).sum().backward()
        optimizer.step()
        return {"table": table}

    report = detaudit.audit(step, repeats=3)
    [cause] = report.root_causes
    assert report.verdict == "nondeterministic" and cause.effect == "final-state" and report.exit_code == 1


# -- 3. one hazard, one root cause ---------------------------------------------------------------------------
def test_a_value_python_reads_after_the_cause_is_propagated(capsys, tmp_path):
    """`print(step, loss.item())` after the step: the differing float that
    `.item()` returns is data downstream of the race, not a program path."""
    source = (FIXTURES / "index_put_backward.py").read_text()
    script = tmp_path / "index_put_logged.py"
    script.write_text(source.replace("    optimizer.step()\n", "    optimizer.step()\n    print(step, loss.item())\n"))
    code, report = _run_json(capsys, script, "--steps", "0", "--repeats", "2")
    [cause] = report["root_causes"]
    assert code == 1 and (cause["kind"], cause["line"]) == ("nondeterministic-op", 17)
    assert cause["op"].startswith("aten.index_put") and cause["effect"] == "final-state"


def test_a_checkpoint_saved_and_loaded_back_is_downstream_of_the_cause(capsys, tmp_path):
    """The word language model's shape: keep the best model with
    `torch.save`, load it back with `torch.load` and evaluate it.  The loaded
    bytes enter torch through a storage argument (`set_`), from outside any
    op, after Python has read the differing weights: downstream of the race,
    not a second root cause."""
    source = (FIXTURES / "index_put_backward.py").read_text()
    script = tmp_path / "index_put_checkpoint.py"
    script.write_text(
        source
        + "\ncheckpoint = __file__ + '.best.pt'\n"
        "torch.save({'table': table.detach()}, checkpoint)\n"
        "with torch.no_grad():\n"
        "    table.copy_(torch.load(checkpoint)['table'])\n"
        "    print('test loss', (table[token_ids[:1000]] * weights[:1000]).sum().item())\n"
    )
    code, report = _run_json(capsys, script, "--steps", "0", "--repeats", "2")
    [cause] = report["root_causes"]
    assert code == 1 and (cause["kind"], cause["line"]) == ("nondeterministic-op", 17)
    assert cause["op"].startswith("aten.index_put") and report["propagated_ops"] > 0


def test_an_unseeded_batch_sampler_is_one_root_cause(capsys):
    """The sampler's offsets enter torch on one line; on the next lines
    Python reads them (`data[i : i + block]`) and the batches it cuts enter as
    new external inputs, and the logged loss differs: all downstream."""
    script = FIXTURES / "memmap_sampler_unseeded.py"
    code, report = _run_json(capsys, script, "--no-seed", "--repeats", "2", "--steps", "0")
    [cause] = report["root_causes"]
    assert code == 1 and report["verdict"] == "nondeterministic"
    assert (cause["kind"], cause["line"]) == ("external-input", _line_of(script, "ix = torch.from_numpy"))
    assert cause["op"] == "aten.lift_fresh.default"  # where the offsets enter, not a digest of the tracer's own
    assert report["propagated_ops"] > 0 and report["tensors"]


# -- 4. and 5. settings compared, environment ---------------------------------------------------------------
def test_vary_threads_catches_a_thread_count_difference_in_a_module_level_model(capsys):
    """The issue's command on an MLP whose result really depends on the thread
    count: each run runs with the count it was given, and the final state,
    found through the module-level `model`, shows the difference."""
    script = FIXTURES / "mlp_thread_count.py"
    code, report = _run_json(capsys, script, "--vary", "threads", "--repeats", "4", "--steps", "0")
    assert code == 1 and report["verdict"] == "nondeterministic"
    assert report["variation"] == {"vary": "threads", "settings": [1, 1, 2, 4], "in_effect": [1, 1, 2, 4]}
    # PReLU's slope gradient is one sum split across threads on every CPU; whether the
    # matmuls' backward splits its reduction too depends on the CPU (on AVX-512 it does)
    causes = report["root_causes"]
    assert {(cause["kind"], cause["phase"], cause["line"]) for cause in causes} == {
        ("thread-count", "backward", _line_of(script, "loss = "))
    }
    assert "model.1" in {cause["module"] for cause in causes}
    assert "final-state" in {cause["effect"] for cause in causes}
    assert "model.1.weight.grad" in {tensor["name"] for tensor in report["tensors"]}
    assert report["warnings"] == []


def test_vary_threads_says_when_the_script_pins_its_own_thread_count(capsys):
    script = FIXTURES / "mlp_pinned_threads.py"
    code, report = _run_json(capsys, script, "--vary", "threads", "--repeats", "3", "--steps", "0")
    assert code == 0 and report["verdict"] == "deterministic"
    assert report["variation"] == {"vary": "threads", "settings": [1, 1, 2], "in_effect": [1, 1, 1]}
    [warning] = report["warnings"]
    pin = _line_of(script, "torch.set_num_threads(1)")
    assert f"torch.set_num_threads(1) at {script}:{pin}" in warning or f"mlp_pinned_threads.py:{pin}" in warning
    assert "run 3 asked for 2, ran with 1" in warning and "compared no threads at all" in warning


def test_the_text_report_shows_what_matters_of_the_environment():
    environment = fingerprint()
    report = RunReport(
        target="train.py",
        repeats=3,
        steps=2,
        root_causes=[],
        tensors=[],
        environment=environment,
        variation={"vary": "threads", "settings": [1, 1, 2], "in_effect": [1, 1, 2]},
        environment_differences={"torch.get_num_threads": [1, 1, 2]},
    )
    assert "with threads 1, 1, 2 were bitwise identical" in report.verdict_line()
    text = report.environment_text()
    assert f"torch.version={torch.__version__}" in text and "env.PYTHONHASHSEED=" in text
    assert "torch.get_num_threads=1, 1, 2" in text
    assert "torch.are_deterministic_algorithms_enabled=False" in text
    # settings at their default, where they cannot matter, stay in the JSON only
    assert "torch.backends.cudnn.benchmark" not in text and "platform=" not in text
    assert "torch.backends.cudnn.benchmark" in json.dumps(report.to_dict()["environment"])
