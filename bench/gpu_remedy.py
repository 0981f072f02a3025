"""The GPU cases of ``detaudit run --remedy`` (needs CUDA; CI has none).

    python bench/gpu_remedy.py [--repeats 3] [--timing-repeats 3] [--out DIR] [FIXTURE ...]

For each CUDA fixture below, runs ``detaudit run FIXTURE --remedy --format
json`` in a subprocess, prints what it found (the trials, the minimal sets,
the cost table, the code to paste) and checks what the fixture is built to
show.  The GPU acceptance script calls it as it is; ``check_fixture`` does one
fixture for callers in Python.  Exit 0 when every expectation held, 1 when
one did not, 2 when CUDA is missing or a run could not be audited.
Each JSON report is kept in ``--out`` (default: a temporary directory).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "dynamic"


def _minimal(remedy: dict) -> set[tuple[str, ...]]:
    return {tuple(names) for names in remedy["minimal"]}


def _expect_cudnn(remedy: dict) -> list[str]:
    """cuDNN weight-gradient algorithm choice: cuDNN's deterministic setting is enough alone."""
    problems = []
    if ("cudnn-deterministic",) not in _minimal(remedy):
        problems.append(f"expected cuDNN deterministic to be sufficient alone, minimal sets: {remedy['minimal']}")
    rows = {row["settings"]: row for row in remedy["timing"]}
    if len(rows) < 3:
        problems.append("the cost table lacks a configuration")
    return problems


def _expect_index_add(remedy: dict) -> list[str]:
    """CUDA index_add_ (atomicAdd): deterministic algorithms switch it to a deterministic kernel."""
    if ("deterministic-algorithms",) not in _minimal(remedy):
        return [f"expected deterministic algorithms to be sufficient, minimal sets: {remedy['minimal']}"]
    return []


def _expect_raises(remedy: dict) -> list[str]:
    """CUDA put_(accumulate=True): deterministic algorithms raise; the advice names the replacement."""
    advice = [t.get("advice") or "" for t in remedy["trials"]] + [a for c in remedy["causes"] for a in c["advice"]]
    if not any("index_put_" in text and "no deterministic kernel" in text for text in advice):
        return ["expected the advice to replace put_ with index_put_ (no deterministic kernel)"]
    return []


CASES: dict[str, Callable[[dict], list[str]]] = {
    "cuda_conv.py": _expect_cudnn,
    "cuda_index_add.py": _expect_index_add,
    "cuda_put_accumulate.py": _expect_raises,
}


def check_fixture(fixture: str, out: Path, repeats: int = 3, timing_repeats: int = 3) -> tuple[int, list[str]]:
    """Run one fixture; (exit code of detaudit, problems with what it found)."""
    command = [
        sys.executable, "-m", "detaudit", "run", str(FIXTURES / fixture), "--remedy", "--format", "json",
        "--repeats", str(repeats), "--timing-repeats", str(timing_repeats),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode not in (0, 1):
        return done.returncode, [f"detaudit exited {done.returncode}:\n{done.stderr[-3000:]}"]
    report = json.loads(done.stdout)
    (out / fixture.replace(".py", ".json")).write_text(json.dumps(report, indent=2))
    remedy = report.get("remedy")
    print(f"== {fixture}: {report['verdict']}")
    if remedy is None:
        return done.returncode, ["the runs were deterministic: nothing to remedy (expected nondeterminism)"]
    _print(remedy)
    return done.returncode, CASES[fixture](remedy)


def _print(remedy: dict) -> None:
    for cause in remedy["causes"]:
        print(f"  cause {cause['kind']} {cause['op']} at {cause['path']}:{cause['line']}: try {', '.join(cause['candidates'])}")
        for advice in cause["advice"]:
            print(f"    {advice}")
    for trial in remedy["trials"]:
        outcome = "reproducible" if trial["reproducible"] else trial["error"] or f"not enough: {trial['remaining']}"
        print(f"  {trial['title']}: {outcome}")
    print(f"  minimal: {remedy['minimal']}  chosen: {remedy['chosen']}")
    for row in remedy["timing"]:
        step = "-" if row["median_step_s"] is None else f"{row['median_step_s'] * 1e3:.3f} ms"
        cost = "-" if row["cost_vs_default"] is None else f"{row['cost_vs_default']:.2f}x"
        print(f"  {row['settings']:<50} reproducible={row['reproducible']!s:<5} {step:>12} {cost:>7} {row['error'] or ''}")
    if remedy["code"]:
        print("  code to paste:")
        print("\n".join(f"    {line}" for line in remedy["code"].splitlines()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", nargs="*", metavar="FIXTURE", help=f"some of {', '.join(CASES)} (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timing-repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="where the JSON reports go (default: a temporary directory)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.fixtures) - set(CASES))
    if unknown:
        parser.error(f"unknown fixture {unknown[0]}: choose from {', '.join(CASES)}")
    import torch

    if not torch.cuda.is_available():
        print("gpu_remedy: no CUDA device", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-remedy-"))
    out.mkdir(parents=True, exist_ok=True)
    failed = audit_failed = False
    for fixture in args.fixtures or CASES:
        code, problems = check_fixture(fixture, out, args.repeats, args.timing_repeats)
        audit_failed |= code not in (0, 1)
        for problem in problems:
            print(f"  PROBLEM: {problem}")
        failed |= bool(problems)
    print(f"reports in {out}")
    return 2 if audit_failed else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
