"""Where ``detaudit run``'s run 1 spends time and memory, against a later run and a plain one.

Run 1 of an audit differs from the later runs in one thing: it keeps the
tensors of its first steps' ops (``keep_first_steps``, bounded by
``online_capture.FIRST_STEPS_BYTES``), while a later run compares itself with
run 1's trace as it runs (``compare_with``).  This script runs SCRIPT once
plainly (``python SCRIPT``, stopped after the same steps by a step hook, no
detaudit), then as run 1, then as run 2 with run 1's trace, each in a fresh
process, ``--rounds`` times in rotation, and prints each one's median wall
time and peak resident memory (of the process tree: ``RUSAGE_CHILDREN`` of a
measuring process of its own), and their ratios to the plain run.

Usage: python bench/run1_cost.py SCRIPT [--steps N] [--rounds R] [-- ARGS...]

docs/cost.md's "Long runs" figures: in a nanoGPT checkout (karpathy/nanoGPT,
with ``bench/realcode_dynamic.py``'s synthetic shakespeare_char data),
``python bench/run1_cost.py train.py --steps N -- config/train_shakespeare_char.py
--device=cpu --compile=False --eval_iters=1 --log_interval=1 --block_size=32
--batch_size=4 --n_layer=6 --n_head=2 --n_embd=32 --max_iters=1000
--lr_decay_iters=1000 --always_save_checkpoint=False --eval_interval=1000``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAIN_TRUTH = ROOT / "bench" / "realcode" / "plain_truth.py"


def measure(kind: str, script: str, args: list[str], steps: int, folder: Path) -> dict:
    """One run of ``kind`` (in this process's child): wall seconds and peak RSS in MiB."""
    from detaudit.dynamic.record.features import SaveFinalState, Tracing
    from detaudit.launch.features import RecordEnvironment
    from detaudit.launch.options import LaunchOptions
    from detaudit.launch.process import run_script

    started = time.perf_counter()
    if kind == "plain":
        subprocess.run([sys.executable, str(PLAIN_TRUTH), "--steps", str(steps), "--out", str(folder / "plain.digest"),
                        script, *args], check=True, capture_output=True)
    else:
        tracing = Tracing(allocation_fill=1, keep_first_steps=True) if kind == "run 1" else Tracing(
            allocation_fill=2, compare_with=str(folder / "run1" / "trace.json"))
        options = LaunchOptions(seed=0, max_steps=steps, output_dir=folder / kind.replace(" ", ""),
                                features=(SaveFinalState(), tracing, RecordEnvironment()))
        result = run_script(script, args, options=options, timeout=3600)
        assert not result.failed, result.describe_failure()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options, args = parser.parse_args(argv[:split]), argv[split + 1 :]
    if options.measure:
        print(json.dumps(measure(options.measure, options.script, args, options.steps, Path(options.folder))))
        return
    kinds = ("plain", "run 1", "run 2")
    results: dict[str, list[dict]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="run1-cost-") as folder:
        for round_ in range(options.rounds):
            for kind in kinds:  # run 2 needs this round's run 1 trace: the order stays
                done = subprocess.run(
                    [sys.executable, __file__, options.script, "--steps", str(options.steps), "--measure", kind,
                     "--folder", folder, *(["--", *args] if args else [])], capture_output=True, text=True, check=True)
                results[kind].append(json.loads(done.stdout.splitlines()[-1]))
    plain = {key: statistics.median(r[key] for r in results["plain"]) for key in ("seconds", "peak_mib")}
    print(f"{Path(options.script).name}, {options.steps} steps, median of {options.rounds}")
    print(f"{'':8} {'wall s':>8} {'x plain':>8} {'peak MiB':>9} {'x plain':>8}")
    for kind in kinds:
        seconds = statistics.median(r["seconds"] for r in results[kind])
        peak = statistics.median(r["peak_mib"] for r in results[kind])
        print(f"{kind:8} {seconds:8.1f} {seconds / plain['seconds']:8.2f} {peak:9.0f} {peak / plain['peak_mib']:8.2f}")


if __name__ == "__main__":
    main()
