"""Time a whole ``detaudit run --repeats 3`` against three plain runs of the same script.

Two short scripts: one deterministic (the audit compares and stops), one that
reads an unseeded numpy generator (the audit has to localize the cause, with
its capture reruns).  Each round runs, one after another, the script three
times plainly (``python script.py``), then the audit of it (``--steps 0``: the
whole script, as the plain runs do), once per ``--jobs`` value asked for, and
with ``--compare-with DIR`` also the audit of another detaudit checkout (say,
main before a change), so that before and after are measured side by side
under the same load.  Prints the medians of wall time and of the children's
CPU time (user + system: steadier than wall time on a loaded machine), and
each audit's ratio to the three plain runs, all measured in this one run.
Not a test: timings depend on the machine.

Usage: python bench/run_overhead.py [--rounds N] [--jobs 1,3] [--compare-with DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "deterministic": ROOT / "fixtures" / "dynamic" / "deterministic_mlp.py",
    "localizes a cause": ROOT / "fixtures" / "dynamic" / "external_numpy.py",
}
REPEATS = 3


def timed(command: list[str], cwd: Path, env: dict) -> tuple[float, float, str]:
    """(wall seconds, children's CPU seconds, stdout) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return wall, cpu, result.stdout


def plain_runs(script: Path) -> tuple[float, float]:
    walls, cpus = zip(*(timed([sys.executable, str(script)], ROOT, dict(os.environ))[:2] for _ in range(REPEATS)))
    return sum(walls), sum(cpus)


def audit(script: Path, checkout: Path, jobs: int) -> tuple[float, float, str]:
    command = [sys.executable, "-m", "detaudit", "run", str(script), "--repeats", str(REPEATS), "--steps", "0"]
    command += ["--format", "json"] + (["--jobs", str(jobs)] if jobs > 1 else [])
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    wall, cpu, out = timed(command, checkout, env)
    return wall, cpu, json.loads(out)["verdict"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--jobs", default="1", help="comma-separated --jobs values to time this checkout's audit with")
    parser.add_argument("--compare-with", type=Path, help="another detaudit checkout, audited beside this one (--jobs 1)")
    args = parser.parse_args()
    jobs_values = [int(value) for value in args.jobs.split(",")]
    audits = [(f"this, --jobs {jobs}", ROOT, jobs) for jobs in jobs_values]
    if args.compare_with:
        audits.insert(0, (f"{args.compare_with}", args.compare_with.resolve(), 1))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    for case, script in CASES.items():
        plain_wall, plain_cpu = [], []
        audit_wall: dict[str, list[float]] = {label: [] for label, _, _ in audits}
        audit_cpu: dict[str, list[float]] = {label: [] for label, _, _ in audits}
        verdicts: dict[str, set] = {label: set() for label, _, _ in audits}
        for _ in range(args.rounds):
            wall, cpu = plain_runs(script)
            plain_wall.append(wall)
            plain_cpu.append(cpu)
            for label, checkout, jobs in audits:
                wall, cpu, verdict = audit(script, checkout, jobs)
                audit_wall[label].append(wall)
                audit_cpu[label].append(cpu)
                verdicts[label].add(verdict)
        base_wall, base_cpu = statistics.median(plain_wall), statistics.median(plain_cpu)
        print(f"\n{case} ({script.name}): {REPEATS} plain runs {base_wall:.2f} s wall, {base_cpu:.2f} s CPU")
        print(f"  {'audit':<40}{'wall s':>8}{'ratio':>8}{'CPU s':>8}{'ratio':>8}  verdict")
        for label, _, _ in audits:
            wall, cpu = statistics.median(audit_wall[label]), statistics.median(audit_cpu[label])
            print(
                f"  {label:<40}{wall:>8.2f}{wall / base_wall:>7.2f}x{cpu:>8.2f}{cpu / base_cpu:>7.2f}x"
                f"  {'/'.join(sorted(verdicts[label]))}",
                flush=True,
            )
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
