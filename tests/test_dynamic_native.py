"""The compiled op recorder (record/native/recorder.cpp) against OpTracer.record.

The compiled recorder must leave exactly the trace the Python one leaves:
every record, digest, RNG event, final-state digest, capture and online
capture, on training loops that take each of its paths (forward, backward,
optimizer with foreach and fused kernels, in-place writes to part of a
tensor, views, allocations filled per run, an LSTM's scratch arguments,
custom autograd Functions, checkpointing, autocast, channels_last, Python
reads and ``.item()``, the forced device digests).  Each loop runs twice from
the same seed, once per recorder, in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from detaudit.dynamic.record import native
from detaudit.dynamic.record.online_capture import OnlineCapture
from detaudit.dynamic.record.tracer import OpTracer
from detaudit.launch.watcher import StopRun, TrainingWatcher

ROOT = Path(__file__).resolve().parents[1]
HAS_COMPILER = shutil.which("c++") is not None


def test_the_compiled_recorder_builds_and_loads_where_there_is_a_compiler():
    if not HAS_COMPILER:
        pytest.skip("no C++ compiler: the tracer records in Python")
    module = native.load()
    library = native.library_path()
    log = library.with_name(library.name + ".failed.log")
    assert module is not None, log.read_text() if log.exists() else "not built"
    tracer = OpTracer()
    assert tracer._modes[0].__torch_dispatch__.__func__ is module.dispatch
    assert not hasattr(OpTracer(compiled=False)._modes[0].__torch_dispatch__, "__self__") or (
        OpTracer(compiled=False)._modes[0].__torch_dispatch__.__func__ is not module.dispatch
    )


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 + x * 0


def mlp_adam_foreach():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=True)
    return model, optimizer, lambda: (torch.randn(8, 16), torch.randint(0, 4, (8,)))


def cnn_adamw_fused_channels_last():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 5),
    ).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    return model, optimizer, lambda: (torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last), torch.randint(0, 5, (4,)))


class _LSTMModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Linear(8, 20)

    def forward(self, tokens):
        out, _ = self.lstm(self.embedding(tokens))
        return self.head(out[:, -1])


def lstm_sgd():
    model = _LSTMModel()
    return model, torch.optim.SGD(model.parameters(), lr=0.1), lambda: (torch.randint(0, 20, (4, 6)), torch.randint(0, 20, (4,)))


class _Odd(nn.Module):
    """In-place writes to part of a tensor, views, an allocation, a custom
    Function, checkpointing, a Python read: the paths a plain model never takes."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        buffer = torch.empty(x.shape[0], 6)
        buffer[:, :3] = x[:, :3]  # a write to part of an allocation
        buffer[:, 3:] = x[:, 3:].t().t()
        h = checkpoint(lambda t: torch.tanh(self.a(t)), buffer, use_reentrant=False)
        h = _Scale.apply(h)
        h.transpose(0, 1)[0].add_(1.0)  # in place through a view
        _ = h[0].detach().tolist()  # a Python read
        return self.b(h)


def odd_paths_sgd():
    model = _Odd()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), lambda: (torch.randn(5, 6), torch.randint(0, 3, (5,)))


class _EvaluatedInInferenceMode(nn.Module):
    """Keeps a running statistic under ``torch.inference_mode()``, as Lightning's
    validation does: an inference tensor has no version counter."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
        self.total = None

    def forward(self, x):
        with torch.inference_mode():
            if self.total is None:
                self.total = torch.zeros(3)
            self.total.add_(self.net(x).mean(0))  # an inference tensor written in place
            (self.total * 2).sum().item()  # and read after the write
        return self.net(x)


def inference_mode_sgd():
    model = _EvaluatedInInferenceMode()
    return model, torch.optim.SGD(model.parameters(), lr=0.1), lambda: (torch.randn(5, 6), torch.randint(0, 3, (5,)))


def autocast_bf16():
    model = nn.Sequential(nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, lambda: (torch.randn(6, 12), torch.randint(0, 2, (6,)))


def wide_mlp_sgd():
    """Tensors past CRC_MAX_BYTES, whose digest is the weighted sum of their words, one of
    them with 4 trailing bytes (33 x 131 float32): the compiled recorder takes it in C++."""
    model = nn.Sequential(nn.Linear(40, 131), nn.ReLU(), nn.Linear(131, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), lambda: (torch.randn(33, 40), torch.randint(0, 3, (33,)))


WORKLOADS = {
    "mlp-adam-foreach": (mlp_adam_foreach, False),
    "wide-mlp-sgd": (wide_mlp_sgd, False),
    "cnn-adamw-fused-channels-last": (cnn_adamw_fused_channels_last, False),
    "lstm-sgd": (lstm_sgd, False),
    "odd-paths": (odd_paths_sgd, False),
    "autocast-bf16": (autocast_bf16, True),
    "inference-mode": (inference_mode_sgd, False),
}


def traced_run(workload: str, compiled: bool, steps: int = 2, **tracer_options) -> tuple[OpTracer, OnlineCapture | None]:
    build, autocast = WORKLOADS[workload]
    torch.manual_seed(0)
    model, optimizer, batch = build()
    watcher = TrainingWatcher()
    observe = tracer_options.pop("observe", False)
    tracer_options.setdefault("allocation_fill", 1)  # as detaudit run fills them: no uninitialized bytes
    tracer = OpTracer(compiled=compiled, **tracer_options)
    tracer.attach(watcher)
    observer = tracer.observer = OnlineCapture(tracer, None) if observe else None
    try:
        with tracer, contextlib.suppress(StopRun):  # (StopRun: every capture asked for is kept)
            for _ in range(steps):
                inputs, targets = batch()
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = nn.functional.cross_entropy(model(inputs), targets)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                loss.item()
            tracer.note_final_state({name: p.detach() for name, p in model.named_parameters()})
    finally:
        watcher.close()
    return tracer, observer


def assert_same_trace(python: OpTracer, compiled: OpTracer, noisy: frozenset = frozenset()) -> None:
    """``noisy``: digests that differ between two runs recorded alike (bytes a kernel never wrote)."""
    expected, actual = python.trace_data(), compiled.trace_data()
    assert len(actual["ops"]) == len(expected["ops"])
    for index, (want, got) in enumerate(zip(expected["ops"], actual["ops"])):
        assert tuple(got) == tuple(want), f"record {index}"
    assert len(actual["digests"]) == len(expected["digests"])
    differing = {i for i, (want, got) in enumerate(zip(expected["digests"], actual["digests"])) if want != got}
    assert differing <= noisy
    assert actual["rng_events"] == expected["rng_events"]
    assert actual["final"] == expected["final"]


def _same_tensors(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_tensors(x, y) for x, y in zip(a, b))
    return a == b


needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler: nothing compiled to compare")


@needs_compiler
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_compiled_recorder_leaves_the_python_recorders_trace(workload):
    python, _ = traced_run(workload, compiled=False)
    compiled, _ = traced_run(workload, compiled=True)
    assert len(python.records) > 100
    assert_same_trace(python, compiled, noisy_digests(workload, python))


def noisy_digests(workload: str, python: OpTracer) -> frozenset:
    """The digests of bytes no kernel wrote: the LSTM's workspaces, which end
    in padding oneDNN never writes (read by no op as data, so no difference of
    the run), and nothing else.  Whether two runs' padding happens to match is
    the allocator's luck: a second Python-recorded run may differ there, and
    nowhere else."""
    noisy = frozenset(record[9][-1] for record in python.records if record[0] == "aten.mkldnn_rnn_layer.default")
    again, _ = traced_run(workload, compiled=False)
    assert {i for i, (a, b) in enumerate(zip(python.digests, again.digests)) if a != b} <= noisy
    return noisy


@needs_compiler
@pytest.mark.parametrize("workload", ["odd-paths", "mlp-adam-foreach"])
def test_the_compiled_recorder_takes_the_device_digest_path_as_python_does(workload):
    python, _ = traced_run(workload, compiled=False, device_digests=True)
    compiled, _ = traced_run(workload, compiled=True, device_digests=True)
    assert_same_trace(python, compiled)


@needs_compiler
def test_allocations_are_filled_and_captures_kept_alike():
    # capture ops scattered over the trace: each is recorded in Python, between compiled records
    python, _ = traced_run("odd-paths", compiled=False, allocation_fill=3, capture_ops=(5, 40, 77, 150), sampled_ops=(77,))
    compiled, _ = traced_run("odd-paths", compiled=True, allocation_fill=3, capture_ops=(5, 40, 77, 150), sampled_ops=(77,))
    assert_same_trace(python, compiled)
    assert sorted(compiled.captured) == [5, 40, 77, 150]
    assert _same_tensors(python.captured, compiled.captured)


@needs_compiler
@pytest.mark.parametrize("workload", ["odd-paths", "lstm-sgd"])
def test_the_observer_is_told_the_same_by_both_recorders(workload):
    python, python_capture = traced_run(workload, compiled=False, observe=True)
    compiled, compiled_capture = traced_run(workload, compiled=True, observe=True)
    noisy = noisy_digests(workload, python)
    assert_same_trace(python, compiled, noisy)
    # the records whose outputs hold bytes no kernel wrote are kept by both, with those bytes
    noisy_records = {index for index, record in enumerate(python.records) if noisy & set(record[9])}
    assert python_capture.full and python_capture.sampled
    for kept in ("full", "sampled"):
        expected, actual = getattr(python_capture, kept), getattr(compiled_capture, kept)
        assert expected.keys() == actual.keys()
        assert all(_same_tensors(expected[i], actual[i]) for i in expected.keys() - noisy_records)


class _CountingTracer(OpTracer):
    """An OpTracer that keeps the index of each record its Python ``record`` makes."""

    def __init__(self, **options):
        super().__init__(**options)
        self.python_records = []

    def record(self, func, args, kwargs, caller):
        self.python_records.append(len(self.records))
        return super().record(func, args, kwargs, caller)


@needs_compiler
def test_the_compiled_recorder_leaves_python_only_what_it_does_not_do():
    torch.manual_seed(0)
    model, optimizer, batch = mlp_adam_foreach()
    inputs, targets = batch()

    def step(tracer):
        with tracer, contextlib.suppress(StopRun):
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
            loss = nn.functional.cross_entropy(model(inputs), targets)
            loss.item()  # an op that returns a Python number: compiled too
        return tracer

    python = step(_CountingTracer(compiled=False))
    assert set(python.python_records) >= set(range(len(python.records)))  # (and untraced ops, recording nothing)
    compiled = step(_CountingTracer())
    assert len(compiled.records) > 20 and compiled.python_records == []
    # a captured op is the Python recorder's: those alone
    capturing = step(_CountingTracer(capture_ops=(3, 17, 1000)))
    assert capturing.python_records == [3, 17]


_LOAD_AND_TRACE = """
import json, torch
from detaudit.dynamic.record import native
from detaudit.dynamic.record.tracer import OpTracer
tracer = OpTracer()
with tracer:
    (torch.ones(3) * 2).sum()
mode = tracer._modes[0]
print(json.dumps({"loaded": native.load() is not None, "compiled": hasattr(mode, "_native_state"), "ops": len(tracer.records)}))
print(tracer.recorder)
"""


def _load_and_trace(tmp_path, **environment) -> dict:
    env = {**os.environ, "DETAUDIT_NATIVE_CACHE": str(tmp_path / "cache"), **environment}
    done = subprocess.run([sys.executable, "-c", _LOAD_AND_TRACE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-2])


def _recorder(tmp_path, **environment) -> str:
    """Which recorder a tracer in a fresh process says it uses (``OpTracer.recorder``)."""
    env = {**os.environ, "DETAUDIT_NATIVE_CACHE": str(tmp_path / "cache"), **environment}
    done = subprocess.run([sys.executable, "-c", _LOAD_AND_TRACE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_without_a_compiler_the_tracer_records_in_python_and_tries_again_later(tmp_path):
    assert _load_and_trace(tmp_path, CXX=str(tmp_path / "no-such-compiler")) == {"loaded": False, "compiled": False, "ops": 3}
    assert not list((tmp_path / "cache").glob("*.failed.log"))  # nothing recorded: a compiler installed later is used


def test_a_failed_build_is_logged_once_and_the_tracer_records_in_python(tmp_path):
    assert _load_and_trace(tmp_path, CXX="false") == {"loaded": False, "compiled": False, "ops": 3}
    [log] = (tmp_path / "cache").glob("*.failed.log")
    assert log.read_text().startswith("false ")
    assert _load_and_trace(tmp_path, CXX="false")["loaded"] is False  # not retried: the log stays


@needs_compiler
def test_a_failed_build_is_retried_once_the_compiler_changes(tmp_path):
    assert _load_and_trace(tmp_path, CXX="false")["loaded"] is False
    assert _recorder(tmp_path, CXX="false").startswith("python (its build failed (log: ")
    # another compiler (as when one is installed or $CXX fixed): the old failure no longer counts
    assert _load_and_trace(tmp_path) == {"loaded": True, "compiled": True, "ops": 3}
    assert not list((tmp_path / "cache").glob("*.failed.log"))
    assert _recorder(tmp_path) == "compiled"


def test_the_tracer_says_which_recorder_it_uses_and_why_not_the_compiled_one(tmp_path):
    assert _recorder(tmp_path, DETAUDIT_NATIVE="0") == "python (DETAUDIT_NATIVE=0)"
    missing = str(tmp_path / "no-such-compiler")
    assert _recorder(tmp_path, CXX=missing) == f"python (no C++ compiler ({missing!r} not found; set $CXX))"


def test_detaudit_native_0_turns_the_compiled_recorder_off(tmp_path):
    assert _load_and_trace(tmp_path, DETAUDIT_NATIVE="0") == {"loaded": False, "compiled": False, "ops": 3}
    assert not (tmp_path / "cache").exists()


@needs_compiler
def test_a_build_into_an_empty_cache_is_loaded(tmp_path):
    assert _load_and_trace(tmp_path) == {"loaded": True, "compiled": True, "ops": 3}
    assert len(list((tmp_path / "cache").glob("native_record-*.so"))) == 1


def _audit(script: Path, **environment) -> tuple[str, list[dict]]:
    """The verdict and the root causes (kind, op, line, phase) of ``detaudit run`` on ``script``."""
    done = subprocess.run(
        [sys.executable, "-m", "detaudit", "run", str(script), "--repeats", "2", "--format", "json"],
        env={**os.environ, **environment}, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    fields = ("kind", "op", "path", "line", "phase")
    return report["verdict"], [{field: cause[field] for field in fields} for cause in report["root_causes"]]


@needs_compiler
def test_detaudit_run_names_the_same_cause_with_either_recorder():
    script = ROOT / "fixtures" / "dynamic" / "index_put_backward.py"
    verdict, causes = _audit(script)
    assert (verdict, causes) == _audit(script, DETAUDIT_NATIVE="0")
    assert verdict == "nondeterministic" and causes


def test_the_run_report_says_which_recorder_traced_and_why_not_the_compiled_one():
    script = ROOT / "fixtures" / "dynamic" / "deterministic_mlp.py"
    command = [sys.executable, "-m", "detaudit", "run", str(script), "--repeats", "2", "--steps", "1"]
    environment = {**os.environ, "DETAUDIT_NATIVE": "0"}
    as_json = subprocess.run([*command, "--format", "json"], env=environment, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["environment"]["detaudit.recorder"] == "python (DETAUDIT_NATIVE=0)"
    as_text = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, cwd=ROOT)
    environment_line = " ".join(as_text.stdout.partition("Environment: ")[2].split())  # undo the console's wrapping
    assert "detaudit.recorder=python (DETAUDIT_NATIVE=0)" in environment_line


@pytest.mark.parametrize("compiled", [False, True] if HAS_COMPILER else [False], ids=["python", "compiled"][: 1 + HAS_COMPILER])
def test_an_inference_tensor_written_in_place_is_read_as_written(compiled):
    tracer, _ = traced_run("inference-mode", compiled=compiled)
    ops = tracer.trace_data()["ops"]
    here = [op for op in ops if op.path.endswith("test_dynamic_native.py") and op.module == "model"]
    written = [op for op in here if op.op == "aten.add_.Tensor"]
    read = [op for op in here if op.op == "aten.mul.Tensor" and op.line == written[0].line + 1]
    assert len(written) == len(read) == 2  # one per step
    for write, after in zip(written, read):
        assert after.inputs[0] == write.outputs[0]  # the digest of the bytes the write left


class _Boxed(torch.Tensor):
    """A minimal wrapper subclass, as DTensor is: its data is the tensor inside it,
    which its in-place ops write below autograd, with no version bump."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        return _Boxed(inner_tensors["inner"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unboxed = [a.inner if isinstance(a, _Boxed) else a for a in args]
        result = func(*unboxed, **(kwargs or {}))
        return args[0] if func._schema.arguments[0].alias_info and func._schema.arguments[0].alias_info.is_write else result


@pytest.mark.parametrize("compiled", [False, True] if HAS_COMPILER else [False], ids=["python", "compiled"][: 1 + HAS_COMPILER])
def test_a_tensor_a_wrapper_subclass_writes_in_place_is_read_as_written(compiled):
    # FSDP2's init_weights and optimizer write each DTensor's shard this way: a stale digest
    # of the shard made a latent cause of to_empty's garbage in a torchtitan-style loop
    inner = torch.zeros(4)
    tracer = OpTracer(compiled=compiled)
    with tracer:
        inner.sum()
        version = inner._version
        _Boxed(inner).add_(1.0)
        inner.sum()
    assert inner._version == version and inner.tolist() == [1.0] * 4  # written, and no version counter saw it
    sums = [op for op in tracer.trace_data()["ops"] if op.op == "aten.sum.default"]
    assert len(sums) == 2 and sums[0].inputs != sums[1].inputs
