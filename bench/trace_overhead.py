"""Time a plain training step against the same step under detaudit's tracer.

Prints, for each model and device (CPU; CUDA when available), the median step
time plain and traced, the ratio, the aten ops traced per step and the
tracer's cost per op (traced minus plain, over the ops), all measured in this
one run.  The ``layers10``, ``layers100`` and ``layers1000`` models (10, 100,
1,000 tiny Linear+ReLU layers) sweep the op count on tensors so small that the
per-op cost is all there is.  Beside the tracer's cost per op stands the
floor: what a dispatch mode that does nothing but call the op costs (Python's
share of any TorchDispatchMode, which no tracer written in Python goes
below).  ``--clock cpu`` times the process's CPU time instead of wall time:
steadier on a loaded machine.  ``--baseline PATH`` also times the tracer of
another checkout of detaudit (say, the main branch's) in the same blocks and
prints its cost per op beside this one's: a change's effect, measured under
the same load.  Not a test: timings depend on the machine.

``--instructions`` counts instead of timing, for each model on the CPU:
valgrind's callgrind counts the instructions of one process per side
(plain, the floor, traced, and the baseline's tracer) that runs the warm-up
and then 1 or 4 steps, and the difference of the two counts is what 3 steps
cost.  The garbage collector is off during the steps, and NumPy's OpenBLAS has
one thread: a collection falls at other ops in two versions of the code (one
full collection adds tens of thousands of instructions per op on 10 layers), and
OpenBLAS's idle thread spins for as long as the process runs; either one swamped
a change's effect.  The added instructions per op do not move with the
machine's load, unlike times on a shared machine (about 2 minutes a process:
``import torch`` under callgrind).

Plain and traced steps alternate in short blocks (a fresh watcher and tracer
per traced block) and the ratio is the median of the per-block ratios, so a
load change on a shared machine hits both sides alike instead of one.

Usage: python bench/trace_overhead.py [--rounds N] [--steps N] [--threads N] [--clock wall|cpu]
                                     [--models mlp,layers10,layers100,layers1000] [--baseline CHECKOUT]
                                     [--instructions]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detaudit.launch.watcher import TrainingWatcher  # noqa: E402
from detaudit.dynamic.record.tracer import OpTracer  # noqa: E402


def small_cnn(device):
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).to(device)
    return model, torch.randn(32, 3, 32, 32, device=device), torch.randint(0, 10, (32,), device=device)


def mlp(device):
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    return model, torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)


def big_matmul(device):
    width = 2048 if device.type == "cuda" else 1024
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)
    return model, torch.randn(512, width, device=device), torch.randint(0, 10, (512,), device=device)


def tiny_layers(count: int):
    """A stack of ``count`` Linear(8, 8)+ReLU layers on 4 rows: per-op cost only."""

    def build(device):
        layers = [module for _ in range(count) for module in (nn.Linear(8, 8), nn.ReLU())]
        model = nn.Sequential(*layers, nn.Linear(8, 10)).to(device)
        return model, torch.randn(4, 8, device=device), torch.randint(0, 10, (4,), device=device)

    return build


MODELS = {
    "mlp": mlp,
    "small_cnn": small_cnn,
    "big_matmul": big_matmul,
    **{f"layers{count}": tiny_layers(count) for count in (10, 100, 1000)},
}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


class Trainer:
    """One model and optimizer; times single training steps."""

    def __init__(self, build, device):
        torch.manual_seed(0)
        self.device = device
        self.model, self.inputs, self.targets = build(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def step_seconds(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        started = clock()
        self.optimizer.zero_grad()
        nn.functional.cross_entropy(self.model(self.inputs), self.targets).backward()
        self.optimizer.step()  # the tracer flushes its digests here, once per step
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return clock() - started


def load_tracer(checkout: Path) -> tuple[type, type]:
    """``OpTracer`` and ``TrainingWatcher`` of another checkout of detaudit,
    imported beside this one's: its modules are loaded under the same names,
    then taken out of ``sys.modules`` again (they keep their own imports)."""

    def loaded() -> dict:
        return {name: module for name, module in sys.modules.items() if name.partition(".")[0] == "detaudit"}

    ours = loaded()
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, str(checkout))
    try:
        try:
            tracer_module = importlib.import_module("detaudit.dynamic.record.tracer")
            watch_module = importlib.import_module("detaudit.launch.watcher")
            native_module = importlib.import_module("detaudit.dynamic.record.native")
        except ModuleNotFoundError:  # a checkout from before dynamic/ had sub-packages
            tracer_module = importlib.import_module("detaudit.dynamic.tracer")
            watch_module = importlib.import_module("detaudit.dynamic.watch")
            native_module = importlib.import_module("detaudit.dynamic.native")
        # its compiled recorder is loaded now, while its modules are the ones imported: the loader
        # of a checkout from before the move imports its tracer when it first loads
        native_module.load()
    finally:
        sys.path.remove(str(checkout))
        for name in loaded():
            del sys.modules[name]
        sys.modules.update(ours)
    if checkout.resolve() not in Path(tracer_module.__file__).resolve().parents:
        sys.exit(f"error: {checkout} holds no detaudit package")
    return tracer_module.OpTracer, watch_module.TrainingWatcher


def traced_block(trainer: Trainer, steps: int, tracing=(OpTracer, TrainingWatcher)) -> tuple[list[float], int]:
    """Step times under a fresh watcher and tracer (after one untimed warm-up
    step), and the number of ops traced per step.  ``tracing``: the tracer and
    watcher classes (this checkout's by default)."""
    tracer_class, watcher_class = tracing
    watcher = watcher_class()
    tracer = tracer_class()
    tracer.attach(watcher)
    try:
        with tracer:
            trainer.step_seconds()
            ops_before = len(tracer.records)
            times = [trainer.step_seconds() for _ in range(steps)]
            ops_per_step = (len(tracer.records) - ops_before) // steps
    finally:
        watcher.close()
    return times, ops_per_step


class CallOnly(TorchDispatchMode):
    """The floor: a dispatch mode that only calls the op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def call_only_block(trainer: Trainer, steps: int) -> list[float]:
    with CallOnly():
        return [trainer.step_seconds() for _ in range(steps)]


def measure(build, device, rounds: int, steps: int, baseline=None) -> dict:
    plain_trainer, traced_trainer = Trainer(build, device), Trainer(build, device)
    baseline_trainer = Trainer(build, device) if baseline else None
    for _ in range(2):  # warm-up: first-call costs (allocator, kernels) on both sides
        plain_trainer.step_seconds()
    plain, traced, floor, before, ratios, ops = [], [], [], [], [], 0
    for _ in range(rounds):
        plain_times = [plain_trainer.step_seconds() for _ in range(steps)]
        floor.extend(call_only_block(plain_trainer, steps))
        traced_times, ops = traced_block(traced_trainer, steps)
        if baseline:
            before.extend(traced_block(baseline_trainer, steps, baseline)[0])
        plain.extend(plain_times)
        traced.extend(traced_times)
        ratios.append(statistics.median(traced_times) / statistics.median(plain_times))
    return {
        "plain": statistics.median(plain),
        "traced": statistics.median(traced),
        "floor": statistics.median(floor),
        "before": statistics.median(before) if before else None,
        "ratio": statistics.median(ratios),
        "ops": ops,
    }


#: One counted process (--instructions): the model's trainer, warmed up, then
#: the warm-up and the steps of one side.  argv: model, side, steps, baseline checkout or "".
_COUNTED = """
import gc
import sys
from pathlib import Path
import torch
sys.path.insert(0, {bench!r})
import trace_overhead as bench
model, side, steps, baseline = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
trainer = bench.Trainer(bench.MODELS[model], torch.device("cpu"))
for _ in range(2):
    trainer.step_seconds()
gc.collect()
gc.disable()  # see the module's docstring: the count is the steps' own work
if side == "plain":
    for _ in range(1 + steps):
        trainer.step_seconds()
elif side == "floor":
    bench.call_only_block(trainer, 1 + steps)
else:
    bench.traced_block(trainer, steps, bench.load_tracer(Path(baseline)) if baseline else (bench.OpTracer, bench.TrainingWatcher))
"""
_COUNTED_STEPS = (1, 4)


def counted_instructions(model: str, side: str, steps: int, baseline: Path | None) -> int:
    """Instructions callgrind counts for one counted process (``_COUNTED``)."""
    with tempfile.TemporaryDirectory() as work:
        counts = Path(work) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counts}", sys.executable, "-c",
             _COUNTED.format(bench=str(Path(__file__).resolve().parent)), model, side, str(steps), str(baseline or "")],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},  # no idle BLAS thread spinning in the count
        )
        summary = next(line for line in counts.read_text().splitlines() if line.startswith("summary:"))
    return int(summary.split()[1])


def ops_per_step(model: str) -> int:
    trainer = Trainer(MODELS[model], torch.device("cpu"))
    return traced_block(trainer, 1)[1]


def count_instructions(models: list[str], baseline: Path | None) -> None:
    """Instructions per op that each side adds to a plain step (2 processes at a time)."""
    sides = ["floor", "traced"] + (["baseline"] if baseline else [])
    print(f"torch {torch.__version__}, 1 CPU thread, callgrind: instructions of steps {_COUNTED_STEPS[0]}..{_COUNTED_STEPS[1]}")
    print(f"{'model':<12}{'ops/step':>9}{'plain/op':>10}" + "".join(f"{'added ' + side + '/op':>20}" for side in sides))
    for model in models:
        jobs = {
            (side, steps): (model, "traced" if side == "baseline" else side, steps, baseline if side == "baseline" else None)
            for side in ("plain", *sides)
            for steps in _COUNTED_STEPS
        }
        with ThreadPoolExecutor(max_workers=2) as pool:
            counts = dict(zip(jobs, pool.map(lambda job: counted_instructions(*job), jobs.values())))
        ops = ops_per_step(model) * (_COUNTED_STEPS[1] - _COUNTED_STEPS[0])
        cost = {side: (counts[side, _COUNTED_STEPS[1]] - counts[side, _COUNTED_STEPS[0]]) / ops for side in ("plain", *sides)}
        print(f"{model:<12}{ops // (_COUNTED_STEPS[1] - _COUNTED_STEPS[0]):>9}{cost['plain']:>10.0f}" + "".join(f"{cost[side] - cost['plain']:>20.0f}" for side in sides), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating plain/traced blocks (default 7)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block (default 5)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads before measuring")
    parser.add_argument("--clock", choices=CLOCKS, default="wall", help="wall time (default) or the process's CPU time")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    parser.add_argument("--baseline", type=Path, help="another checkout of detaudit whose tracer is timed beside this one's")
    parser.add_argument("--instructions", action="store_true", help="count instructions per op (callgrind) instead of timing")
    args = parser.parse_args()
    if args.instructions:
        count_instructions(args.models.split(","), args.baseline)
        return
    baseline = load_tracer(args.baseline) if args.baseline else None
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {args.rounds} rounds x {args.steps} steps,"
        f" {args.clock} clock, load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'model':<12}{'device':<8}{'ops/step':>9}{'plain ms':>10}{'traced ms':>11}{'ratio':>8}"
        f"{'plain us/op':>13}{'added us/op':>13}{'floor us/op':>13}" + (f"{'baseline us/op':>16}" if baseline else "")
    )
    for device in devices:
        for name in args.models.split(","):
            result = measure(MODELS[name], device, args.rounds, args.steps, baseline)
            per_op = result["plain"] * 1e6 / result["ops"]
            added = {key: (result[key] - result["plain"]) * 1e6 / result["ops"] for key in ("traced", "floor", "before") if result[key]}
            print(
                f"{name:<12}{device.type:<8}{result['ops']:>9}{result['plain'] * 1e3:>10.2f}"
                f"{result['traced'] * 1e3:>11.2f}{result['ratio']:>7.2f}x"
                f"{per_op:>13.1f}{added['traced']:>13.1f}{added['floor']:>13.1f}"
                + (f"{added['before']:>16.1f}" if baseline else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
