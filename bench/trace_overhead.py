"""Time a plain training step against the same step under detaudit's tracer.

Prints, for each model and device (CPU; CUDA when available), the median step
time plain and traced, the ratio, and the aten ops traced per step, all
measured in this one run.  Not a test: timings depend on the machine.

Plain and traced steps alternate in short blocks (a fresh watcher and tracer
per traced block) and the ratio is the median of the per-block ratios, so a
load change on a shared machine hits both sides alike instead of one.

Usage: python bench/trace_overhead.py [--rounds N] [--steps N] [--threads N] [--models mlp,small_cnn]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from detaudit.dynamic.tracer import OpTracer  # noqa: E402
from detaudit.dynamic.watch import TrainingWatcher  # noqa: E402


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


MODELS = {"mlp": mlp, "small_cnn": small_cnn, "big_matmul": big_matmul}


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
        started = time.perf_counter()
        self.optimizer.zero_grad()
        nn.functional.cross_entropy(self.model(self.inputs), self.targets).backward()
        self.optimizer.step()  # the tracer flushes its digests here, once per step
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started


def traced_block(trainer: Trainer, steps: int) -> tuple[list[float], int]:
    """Step times under a fresh watcher and tracer (after one untimed warm-up
    step), and the number of ops traced per step."""
    watcher = TrainingWatcher()
    tracer = OpTracer()
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


def measure(build, device, rounds: int, steps: int) -> dict:
    plain_trainer, traced_trainer = Trainer(build, device), Trainer(build, device)
    for _ in range(2):  # warm-up: first-call costs (allocator, kernels) on both sides
        plain_trainer.step_seconds()
    plain, traced, ratios, ops = [], [], [], 0
    for _ in range(rounds):
        plain_times = [plain_trainer.step_seconds() for _ in range(steps)]
        traced_times, ops = traced_block(traced_trainer, steps)
        plain.extend(plain_times)
        traced.extend(traced_times)
        ratios.append(statistics.median(traced_times) / statistics.median(plain_times))
    return {
        "plain": statistics.median(plain),
        "traced": statistics.median(traced),
        "ratio": statistics.median(ratios),
        "ops": ops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating plain/traced blocks (default 7)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per block (default 5)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads before measuring")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ", ".join(MODELS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {args.rounds} rounds x {args.steps} steps")
    print(f"{'model':<12}{'device':<8}{'ops/step':>9}{'plain ms':>10}{'traced ms':>11}{'ratio':>8}")
    for device in devices:
        for name in args.models.split(","):
            result = measure(MODELS[name], device, args.rounds, args.steps)
            print(
                f"{name:<12}{device.type:<8}{result['ops']:>9}{result['plain'] * 1e3:>10.2f}"
                f"{result['traced'] * 1e3:>11.2f}{result['ratio']:>7.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
