"""``detaudit run --save-reference`` / ``--against`` on real training scripts, run unchanged.

For each named entry of ``bench/realcode/corpus.json`` (tiny configurations,
synthetic data), with ``ATEN_CPU_CAPABILITY`` standing in for another machine:

1. ground truth from plain runs: the final state's digests under ``default``
   and under this machine's best capability (``bench/realcode/plain_truth.py``);
2. ``detaudit run --repeats 2 --save-reference DIR`` under ``default``;
3. ``detaudit run --against DIR`` under the best capability (a drift exactly
   when the plain runs' digests differ), then under ``default`` again (the
   control: identical);

and prints each verdict, right or wrong against the truth, the first drift
root, the folder's size, and the cost of ``--against`` against one traced
run (half the two-run audit that saved the reference, measured side by side
in this run).

Usage: python bench/realcode_reference.py [--only NAME,...] [--mirrors DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realcode_dynamic import DEFAULT_MIRRORS, PLAIN_TRUTH, load_corpus  # noqa: E402

#: the corpus entries measured: nanoGPT, and the transformer-style minGPT and makemore
NAMES = ("nanogpt-char", "mingpt-chargpt", "makemore-transformer")
REFERENCE_CAPABILITY = "default"


def _environment(script, root: Path, capability: str | None) -> dict:
    environment = {**os.environ, **{name: value.format(root=root) for name, value in script.env}}
    environment.pop("ATEN_CPU_CAPABILITY", None)
    if capability is not None:
        environment["ATEN_CPU_CAPABILITY"] = capability
    return environment


def _plain_digests(script, entry: Path, root: Path, capability: str | None) -> str:
    cwd = root / script.cwd
    out = cwd / f".truth-{capability or 'best'}"
    command = [sys.executable, str(PLAIN_TRUTH), "--steps", str(script.steps or 10**9), "--out", str(out), str(entry), *script.args]
    done = subprocess.run(command, cwd=cwd, env=_environment(script, root, capability), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"plain run exited with {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return "".join(path.read_text() for path in sorted(cwd.glob(f"{out.name}*")))


def _detaudit(script, entry: Path, root: Path, capability: str | None, *options: str) -> tuple[dict, float]:
    command = [sys.executable, "-m", "detaudit", "run", str(entry), *options, "--format", "json", "--", *script.args]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=root / script.cwd, env=_environment(script, root, capability),
                          capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - started
    try:
        return json.loads(done.stdout), seconds
    except json.JSONDecodeError:
        raise RuntimeError(f"detaudit exited with {done.returncode}: {done.stderr.strip().splitlines()[-3:]}") from None


def measure(script, mirrors: Path) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"realcode-reference-{script.name}-"))
    try:
        entry = script.checkout(mirrors, folder)
        truth = "drift" if _plain_digests(script, entry, folder, REFERENCE_CAPABILITY) != _plain_digests(
            script, entry, folder, None) else "identical"
        reference = folder / "reference"
        saved, save_seconds = _detaudit(script, entry, folder, REFERENCE_CAPABILITY, "--steps", str(script.steps),
                                        "--repeats", "2", "--save-reference", str(reference))
        size = sum(path.stat().st_size for path in reference.iterdir())
        against, against_seconds = _detaudit(script, entry, folder, None, "--against", str(reference))
        control, _ = _detaudit(script, entry, folder, REFERENCE_CAPABILITY, "--against", str(reference))
        roots = against.get("root_causes", [])
        first = f"{roots[0]['op']} at {roots[0]['path']}:{roots[0]['line']} ({roots[0]['module'] or '-'})" if roots else "-"
        return {
            "truth": truth, "saved": saved.get("verdict"), "against": against.get("verdict"),
            "control": control.get("verdict"), "first": first, "size": size,
            "against_seconds": against_seconds, "traced_run_seconds": save_seconds / 2,
            "differences": sorted(against.get("environment_differences", {})),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated names (default: " + ",".join(NAMES) + ")")
    parser.add_argument("--mirrors", type=Path, default=DEFAULT_MIRRORS)
    options = parser.parse_args()
    wanted = options.only.split(",") if options.only else NAMES
    wrong = 0
    for script in load_corpus():
        if script.name not in wanted:
            continue
        missing = script.missing(options.mirrors)
        if missing:
            print(f"{script.name:24} skipped: {missing}")
            continue
        outcome = measure(script, options.mirrors)
        right = outcome["against"] == outcome["truth"] and outcome["control"] == "identical"
        wrong += not right
        print(f"{script.name:24} plain {outcome['truth']:9} --against {outcome['against']:9} control "
              f"{outcome['control']:9} {'right' if right else 'WRONG':5}  folder {outcome['size'] / 1e3:.0f} kB  "
              f"--against {outcome['against_seconds']:.1f} s = {outcome['against_seconds'] / outcome['traced_run_seconds']:.2f}x "
              f"one traced run ({outcome['traced_run_seconds']:.1f} s)")
        print(f"    first drift root: {outcome['first']}; environment differences: {', '.join(outcome['differences']) or '-'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
