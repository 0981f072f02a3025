"""Time a plain training step against the same step under detaudit's tracer.

Prints, for each model and device (CPU; CUDA when available), the median step
time plain and traced, and the ratio, all measured in this one run.  Not a
test: timings depend on the machine.  Usage: python bench/trace_overhead.py
"""

from __future__ import annotations

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


def median_step_seconds(build, device, traced: bool, steps: int = 15) -> float:
    torch.manual_seed(0)
    model, inputs, targets = build(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    watcher = TrainingWatcher() if traced else None
    tracer = OpTracer() if traced else None
    if tracer:
        tracer.attach(watcher)
        tracer.__enter__()
    try:
        for _ in range(steps + 3):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()  # the tracer flushes its digests here, once per step
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
    finally:
        if tracer:
            tracer.__exit__(None, None, None)
            watcher.close()
    return statistics.median(times[3:])


def main() -> None:
    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    print(f"{'model':<12}{'device':<8}{'plain ms':>10}{'traced ms':>11}{'ratio':>8}")
    for device in devices:
        for name, build in (("mlp", mlp), ("small_cnn", small_cnn), ("big_matmul", big_matmul)):
            plain = median_step_seconds(build, device, traced=False)
            traced = median_step_seconds(build, device, traced=True)
            print(f"{name:<12}{device.type:<8}{plain * 1e3:>10.2f}{traced * 1e3:>11.2f}{traced / plain:>7.2f}x")


if __name__ == "__main__":
    main()
