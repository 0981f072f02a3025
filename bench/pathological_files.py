"""How long does `detaudit check` take on files shaped to be slow?

Shapes (``--shape``), each of size N, followed by a
``torch.backends.cudnn.benchmark = True`` line that must still be reported:

- ``chain``: ``x = torch.randn(1) + ...`` with N terms in one expression
  (libcst's native parser is quadratic in the chain's length);
- ``repeated-hits``: N statements ``yN = a.index_add_(0, i, s)``, each a finding
  whose text repeats (locating them was quadratic in detaudit's own code).

For each N, side by side in one run, each in a fresh process with a timeout:

- bare ``libcst.parse_module`` of the file,
- ``detaudit check`` of this checkout,
- ``detaudit check`` of another checkout (``--baseline DIR``, e.g. an export
  of an older commit: ``git archive COMMIT | tar -x -C DIR``).

    python bench/pathological_files.py [--shape chain] [--sizes 1000 2000 5000] [--baseline DIR] [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARSE = "import sys, libcst; libcst.parse_module(open(sys.argv[1], encoding='utf-8').read())"
SHAPES = {
    "chain": lambda n: "x = " + " + ".join(["torch.randn(1)"] * n) + "\n",
    "repeated-hits": lambda n: "".join(f"y{i} = a.index_add_(0, i, s)\n" for i in range(n)),
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], pythonpath: Path, cwd: Path, timeout: float) -> tuple[str, subprocess.CompletedProcess | None]:
    """('12.3 s wall, 4.5 s CPU', the process) or ('> timeout', None)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    cpu, started = children_cpu(), time.perf_counter()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"> {timeout:.0f} s (timed out)", None
    return f"{time.perf_counter() - started:6.1f} s wall, {children_cpu() - cpu:6.1f} s CPU", done


def verdict(done: subprocess.CompletedProcess | None) -> str:
    if done is None:
        return ""
    try:
        names = [f["name"] for f in json.loads(done.stdout)["findings"]]
    except (ValueError, KeyError):
        return f"exit {done.returncode}, no report: {done.stderr.strip().splitlines()[-1:]}"
    return f"exit {done.returncode}: {', '.join(names) or 'no findings'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="chain")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 5000])
    parser.add_argument("--baseline", type=Path, help="another detaudit checkout to time alongside")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per process (default 300)")
    parser.add_argument("--no-parse", action="store_true", help="skip the bare libcst parse")
    options = parser.parse_args()

    check = [sys.executable, "-m", "detaudit", "check", "--no-cache", "--format", "json", "train.py"]
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        for size in options.sizes:
            text = "import torch\n" + SHAPES[options.shape](size) + "torch.backends.cudnn.benchmark = True\n"
            (cwd / "train.py").write_text(text, encoding="utf-8")
            print(f"{options.shape}, size {size} ({len(text)} bytes):", flush=True)
            if not options.no_parse:
                took, _ = timed([sys.executable, "-c", PARSE, "train.py"], REPO, cwd, options.timeout)
                print(f"  bare libcst parse   {took}", flush=True)
            if options.baseline is not None:
                took, done = timed(check, options.baseline.resolve(), cwd, options.timeout)
                print(f"  detaudit baseline   {took}  {verdict(done)}", flush=True)
            took, done = timed(check, REPO, cwd, options.timeout)
            print(f"  detaudit this tree  {took}  {verdict(done)}", flush=True)


if __name__ == "__main__":
    main()
