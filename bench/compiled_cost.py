"""Time a torch.compile'd training step plain against the same step traced compiled (`detaudit run`'s default).

The step: a compiled MLP with LayerNorm (forward and backward are one
Inductor graph each) and an eager SGD update (``--compile-optimizer``: a
compiled one, so every op of the step runs in a graph).  Traced, each graph call is
one record with the digests of what it reads and writes
(``detaudit/dynamic/record/compiled_graphs.py``); the optimizer's ops are
traced one by one as ever.  Plain and traced steps alternate in short blocks
(a fresh tracer per traced block, compiled once beforehand so no block pays
for a compile, and its first step untimed: an audited run enters its tracer once), and the ratio printed is the median of the per-block ratios,
measured side by side in this one run.  (``--eager``'s op-by-op tracing of
the same code is not timed here: under a tracer that does not let dynamo
compile, dynamo recompiles the frame with graph breaks, and the process's
compiled code is no longer the plain run's.)  Not a test: timings depend on
the machine.

Usage: python bench/compiled_cost.py [--rounds N] [--steps N] [--width N] [--batch N]
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
from detaudit.dynamic.record.tracer import OpTracer  # noqa: E402


def model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(),
        nn.Linear(width, width), nn.LayerNorm(width), nn.GELU(),
        nn.Linear(width, 16),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--compile-optimizer", action="store_true",
                        help="compile the optimizer's step too: then every op of the step runs in a compiled graph")
    args = parser.parse_args()

    torch.manual_seed(0)
    net = model(args.width)
    compiled = torch.compile(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-3)
    update = torch.compile(optimizer.step) if args.compile_optimizer else optimizer.step
    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, 16)

    def steps() -> float:
        started = time.perf_counter()
        for _ in range(args.steps):
            optimizer.zero_grad()
            nn.functional.mse_loss(compiled(x), y).backward()
            update()
        return (time.perf_counter() - started) / args.steps

    def traced() -> float:
        with OpTracer(trace_compiled=True):
            # untimed: entering a tracer patches torch functions, and dynamo checks its guards
            # again on the first call (once per audited run, which enters its tracer once)
            warm = args.steps
            args.steps = 1
            steps()
            args.steps = warm
            return steps()

    traced()  # compiles under the tracer's hooks, as in an audited run; later tracers find the graphs on it
    steps()
    ratios, plain_times, traced_times = [], [], []
    for _ in range(args.rounds):
        plain = steps()
        traced_times.append(traced())
        ratios.append(traced_times[-1] / plain)
        plain_times.append(plain)
    what = "compiled step and optimizer" if args.compile_optimizer else "compiled step (eager SGD, traced op by op)"
    print(f"{what}, width {args.width}, batch {args.batch}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds of {args.steps} steps")
    print(f"  plain compiled step        {statistics.median(plain_times) * 1e3:8.2f} ms")
    print(f"  traced compiled step       {statistics.median(traced_times) * 1e3:8.2f} ms")
    print(f"  traced compiled (default)  {statistics.median(ratios):8.2f}x")


if __name__ == "__main__":
    main()
