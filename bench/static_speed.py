"""How fast is `detaudit check` next to a bare `libcst.parse_module` loop?

Corpus: the Python sources of an installed package (torch by default: thousands
of real files nobody here wrote; ``--package timm`` for training-heavy model
code), copied to a temporary project so the cache lands there.
Everything is measured in one run, side by side, and printed as ratios:

- bare libcst parse, one core: lines per CPU-second
- detaudit check, cold (no cache): files/s wall, lines per CPU-second (all
  processes), CPU ratio to the bare parse.  With ``--rounds N`` the bare parse
  and the cold check alternate N times and the ratio printed is the median of
  the rounds' ratios, so that a change of load on a shared machine hits both
  sides of a ratio alike (one round's bare parse varied by 20% between runs
  on a loaded 2-core machine).
- detaudit check, warm (unchanged tree): wall seconds
- one-file check, interpreter start included: a training script (parsed) and a
  file that needs no parse

``--instructions N`` counts instead of timing (valgrind's callgrind: the same
count on every run, however loaded the machine): on N files spread over the
corpus, the instructions of a ``check_file`` loop over those of a bare parse
loop, each less a run that only imports and warms up.  Slow (about 40x), so
on a sample; the ratio of one-core CPU time that the timed rounds estimate
with +-15% noise on a loaded 2-core machine.

    python bench/static_speed.py [--files 1000] [--package torch] [--jobs N] [--rounds N] [--instructions N]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def corpus(package: str, limit: int) -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec(package)  # located, never imported
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {package!r} is not installed")
    package_dir = Path(spec.origin).parent
    files = sorted(p for p in package_dir.rglob("*.py") if p.stat().st_size < 2 * 1024 * 1024)
    return files[:limit]


#: The programs --instructions counts: each reads the files named on its
#: command line and warms detaudit up (imports, knowledge tables) on a small
#: training file; then does nothing more, parses the files, or checks them.
_COUNTED_PRELUDE = """
import sys
from pathlib import Path
import libcst
from detaudit.static.engine.check import check_file
root, files = Path(sys.argv[1]), [Path(name) for name in sys.argv[2:]]
texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
warm_up = root / "warm_up.py"
warm_up.write_text("import torch\\ntorch.backends.cudnn.benchmark = True\\nmodel = torch.nn.Linear(2, 2)\\n")
check_file(warm_up, "warm_up.py", root)
"""
_COUNTED_WORK = {
    "nothing": "",
    "parse": """
for text in texts:
    try:
        libcst.parse_module(text)
    except Exception:
        pass
""",
    "check": """
for f in files:
    check_file(f, f.name, root)
""",
}


def instructions(work: str, project: Path, files: list[Path]) -> int:
    """Instructions callgrind counts for one counted program (``_COUNTED_WORK``)."""
    counts = project / f"callgrind.{work}"
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counts}", sys.executable, "-c",
         _COUNTED_PRELUDE + _COUNTED_WORK[work], str(project), *map(str, files)],
        env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    summary = next(line for line in counts.read_text().splitlines() if line.startswith("summary:"))
    return int(summary.split()[1])


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_detaudit(args: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its workers)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cpu_before, started = children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "detaudit", *args], cwd=cwd, env=env, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started, children_cpu() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="how many source files (default 1000)")
    parser.add_argument("--package", default="torch", help="whose installed sources to check (default torch)")
    parser.add_argument("--jobs", type=int, help="worker processes of detaudit check (default: its own)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating bare-parse / cold-check rounds (default 1)")
    parser.add_argument("--instructions", type=int, metavar="N",
                        help="also count instructions (callgrind) of checking and parsing N sample files")
    options = parser.parse_args()

    files = corpus(options.package, options.files)
    with tempfile.TemporaryDirectory() as scratch:
        project = Path(scratch)
        (project / "pyproject.toml").write_text("[project]\nname = 'corpus'\n")
        texts = []
        for index, source in enumerate(files):
            target = project / "src" / f"{index:05d}_{source.name}"
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(source, target)
            texts.append(target.read_text(encoding="utf-8", errors="replace"))
        lines = sum(t.count("\n") for t in texts)

        import libcst

        def bare_parse_cpu() -> float:
            started = time.process_time()
            for text in texts:
                try:
                    libcst.parse_module(text)
                except Exception:
                    pass
            return time.process_time() - started

        check = ["check", "src", "--format", "json", "--exit-zero"]
        if options.jobs is not None:
            check += ["--jobs", str(options.jobs)]
        rounds = []  # (bare parse CPU-s, cold check wall-s, cold check CPU-s)
        for _ in range(options.rounds):
            bare = bare_parse_cpu()
            rounds.append((bare, *run_detaudit([*check, "--no-cache"], project)))
        bare_cpu = statistics.median(bare for bare, _, _ in rounds)
        cold_wall = statistics.median(wall for _, wall, _ in rounds)
        cold_cpu = statistics.median(cpu for _, _, cpu in rounds)
        ratios = [cpu / bare for bare, _, cpu in rounds]
        shutil.rmtree(project / ".detaudit_cache", ignore_errors=True)
        run_detaudit(check, project)  # fills the cache
        warm_wall, warm_cpu = run_detaudit(check, project)

        script = REPO / "fixtures" / "static" / "backends" / "spellings.py"
        one_file = project / "train.py"
        shutil.copyfile(script, one_file)
        no_parse = project / "util.py"
        no_parse.write_text("def add(a, b):\n    return a + b\n" * 50)
        one_wall, _ = min(run_detaudit(["check", "--no-cache", "--exit-zero", "train.py"], project) for _ in range(3))
        skip_wall, _ = min(run_detaudit(["check", "--no-cache", "--exit-zero", "util.py"], project) for _ in range(3))
        if options.instructions:
            copies = sorted((project / "src").glob("*.py"))
            sample = copies[:: max(1, len(copies) // options.instructions)][: options.instructions]
            counted = {work: instructions(work, project, sample) for work in _COUNTED_WORK}
            sample_lines = sum(text.count("\n") for path, text in zip(copies, texts) if path in sample)

    cores = os.cpu_count() or 1
    print(f"corpus: {len(files)} {options.package} source files, {lines:,} lines; {cores} cores")
    print(f"bare libcst.parse_module (1 core)   : {lines / bare_cpu:10,.0f} lines/CPU-s  ({bare_cpu:.1f} CPU-s)")
    print(f"detaudit check cold, no cache       : {lines / cold_cpu:10,.0f} lines/CPU-s  ({cold_cpu:.1f} CPU-s, "
          f"{cold_wall:.1f} s wall, {len(files) / cold_wall:,.0f} files/s)")
    spread = f", rounds {min(ratios):.2f}-{max(ratios):.2f}x" if len(ratios) > 1 else ""
    print(f"  CPU ratio detaudit / bare parse   : {statistics.median(ratios):10.2f}x   (target <= 1.3x; "
          f"median of {len(ratios)} round{'s' if len(ratios) > 1 else ''}{spread})")
    print(f"detaudit check warm (cache)         : {warm_wall:10.2f} s wall ({warm_cpu:.2f} CPU-s)   (target < 0.5 s for 1,000 files)")
    print(f"one file, parsed, incl. interpreter : {one_wall:10.2f} s wall   (target < 0.8 s)")
    print(f"one file, no parse needed           : {skip_wall:10.2f} s wall   (target < 0.15 s)")
    if options.instructions:
        parse, check = (counted[work] - counted["nothing"] for work in ("parse", "check"))
        print(f"instructions, {len(sample)} sample files ({sample_lines:,} lines): check / bare parse "
              f"{check / parse:.3f}x   ({check / 1e9:.2f} / {parse / 1e9:.2f} G, callgrind; target <= 1.3x)")


if __name__ == "__main__":
    main()
