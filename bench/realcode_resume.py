"""``detaudit resume`` on real training scripts with their own resume option, run unchanged.

For each entry of ``bench/realcode/resume_corpus.json``: lay the script out
(``realcode_dynamic.CorpusScript.checkout``), take the ground truth from
plain runs (straight for N steps; stopped after K; resumed: equivalent when
the resumed run prints the straight run's losses from step K on), then run
``detaudit resume`` and print its verdict and first component, right or
wrong against the truth, and its time against one plain straight run's
(measured side by side in this run).

Usage: python bench/realcode_resume.py [--only NAME,...] [--mirrors DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realcode_dynamic import DEFAULT_MIRRORS, CorpusScript  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "realcode" / "resume_corpus.json"
# what an entry adds to a corpus.json entry ("expected" is then "equivalent" or "diverges")
RESUME_FIELDS = ("interrupt_at", "resume_args", "straight_args", "interrupted_args", "loss_lines", "expected_first", "why")


def _losses(command: list[str], cwd: Path, pattern: str) -> tuple[dict[int, str], float]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"plain run exited with {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return {int(m.group(1)): m.group(2) for m in map(re.compile(pattern).match, done.stdout.splitlines()) if m}, seconds


def audit(entry: dict, mirrors: Path) -> dict:
    """Ground truth and detaudit's report for one corpus entry: truth, verdict, first, right, seconds, plain_seconds."""
    entry = dict(entry)
    resume = {name: entry.pop(name) for name in RESUME_FIELDS}
    script = CorpusScript.from_json(entry)
    folder = Path(tempfile.mkdtemp(prefix=f"realcode-{script.name}-"))
    try:
        path = script.checkout(mirrors, folder)
        cwd = folder / script.cwd
        base = [sys.executable, str(path), *script.args]
        k = resume["interrupt_at"]
        straight, plain_seconds = _losses(base + resume["straight_args"], cwd, resume["loss_lines"])
        _losses(base + resume["interrupted_args"], cwd, resume["loss_lines"])
        resumed, _ = _losses(base + resume["straight_args"] + resume["resume_args"].split(), cwd, resume["loss_lines"])
        compared = [step for step in resumed if step >= k and step in straight]
        truth = "equivalent" if compared and all(resumed[s] == straight[s] for s in compared) else "diverges"
        command = [sys.executable, "-m", "detaudit", "resume", str(path), "--interrupt-at", str(k), "--steps",
                   str(script.steps), f"--resume-args={resume['resume_args']}", "--format", "json",
                   "--", *script.args, *resume["straight_args"]]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1800)
        seconds = time.perf_counter() - started
        report = json.loads(done.stdout)
        first = report["differences"][0]["component"] if report["differences"] else None
        right = report["verdict"] == truth and (truth == "equivalent" or first == resume["expected_first"])
        return {"truth": truth, "verdict": report["verdict"], "first": first, "right": right, "seconds": seconds,
                "plain_seconds": plain_seconds}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def load_corpus() -> list[dict]:
    return json.loads(CORPUS.read_text())["scripts"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated names")
    parser.add_argument("--mirrors", type=Path, default=DEFAULT_MIRRORS)
    options = parser.parse_args()
    wanted = set(options.only.split(",")) if options.only else None
    wrong = 0
    for entry in load_corpus():
        if wanted and entry["name"] not in wanted:
            continue
        missing = CorpusScript.from_json({k: v for k, v in entry.items() if k not in RESUME_FIELDS}).missing(options.mirrors)
        if missing:
            print(f"{entry['name']:28} skipped: {missing}")
            continue
        outcome = audit(entry, options.mirrors)
        wrong += not outcome["right"]
        print(f"{entry['name']:28} plain {outcome['truth']:11} detaudit {outcome['verdict']:11} "
              f"first {outcome['first'] or '-':10} {'right' if outcome['right'] else 'WRONG':6} "
              f"{outcome['seconds'] / outcome['plain_seconds']:5.1f}x "
              f"({outcome['seconds']:.1f} s / {outcome['plain_seconds']:.1f} s)")
        if outcome["truth"] != entry["expected"]:
            print(f"    plain runs gave {outcome['truth']}, the corpus expects {entry['expected']}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
