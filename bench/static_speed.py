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

``--corpus DIR`` measures training code instead: each repository of
``bench/corpus/corpus.toml``, checked out under DIR (see bench/corpus/README.md),
whole (every ``.py`` file, at most ``--per-repo`` of them spread over the
tree), checked in place from its root with the project index at work
(``--no-cache --jobs 1``), against a bare parse of the same files.  Both run in
one process per repository, after a warm-up that imports detaudit and loads its
tables (a per-process constant, as ``import libcst`` is for the bare side;
subtracting a separately timed interpreter start left each small repository's
ratio to the noise of two process starts).  The ratio is printed per
repository (median of ``--rounds`` processes), with the median and the total;
``--instructions N`` counts callgrind instructions of the same two on N
repositories spread over the corpus.

    python bench/static_speed.py [--files 1000] [--package torch] [--jobs N] [--rounds N] [--instructions N]
    python bench/static_speed.py --corpus /tmp/corpus [--per-repo 150] [--instructions N]
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
from detaudit.static.run.discovery import project_root_of
for f in files:
    check_file(f, f.name, project_root_of(f))
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


def corpus_repositories(root: Path, per_repo: int) -> list[tuple[str, Path, list[Path]]]:
    """(name, checkout, its .py files) for each corpus repository checked out under ``root``."""
    sys.path.insert(0, str(REPO / "bench"))
    from corpus_eval import CORPUS, load_corpus

    found = []
    for repo in load_corpus(CORPUS):
        checkout = root / repo.dir
        if not checkout.is_dir():
            continue
        files = sorted(
            path for path in checkout.rglob("*.py")
            if not any(part.startswith(".") for part in path.relative_to(checkout).parts) and path.stat().st_size < 2 * 1024 * 1024
        )
        if files:
            found.append((repo.name, checkout, files[:: max(1, len(files) // per_repo)][:per_repo]))
    return found


def bare_parse_cpu(texts: list[str]) -> float:
    import libcst

    started = time.process_time()
    for text in texts:
        try:
            libcst.parse_module(text)
        except Exception:
            pass
    return time.process_time() - started


#: ``--corpus``: one repository measured in one process, after a warm-up that
#: imports detaudit and loads its tables (a per-process constant, like the bare
#: side's ``import libcst``) by checking the README's training fixture in a
#: project of its own.  Then, in that process, the
#: bare parse loop and a cold check (a project index that has never seen this
#: repository, ``--no-cache``) of the same files, each in CPU seconds.  ``WORK``
#: (argv[1]) picks what runs after the warm-up: ``both`` (timed), or for
#: callgrind ``nothing``, ``parse`` or ``check`` alone.
_REPOSITORY_PROGRAM = """
import contextlib, io, os, sys, tempfile, time
from pathlib import Path
import libcst
from detaudit.cli import main as detaudit
work, warm_up, checkout, names = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
def check(cwd, files):
    os.chdir(cwd)
    with contextlib.redirect_stdout(io.StringIO()):
        detaudit(["check", "--no-cache", "--no-config", "--jobs", "1", "--format", "json", "--exit-zero", *files])
with tempfile.TemporaryDirectory() as warm:
    (Path(warm) / "warm_up.py").write_text(warm_up.read_text())
    check(warm, ["warm_up.py"])
texts = [(checkout / name).read_text(encoding="utf-8", errors="replace") for name in names]
def parse():
    for text in texts:
        try:
            libcst.parse_module(text)
        except Exception:
            pass
if work == "both":
    started = time.process_time(); parse(); bare = time.process_time() - started
    started = time.process_time(); check(checkout, names); print(bare, time.process_time() - started)
elif work == "parse":
    parse()
elif work == "check":
    check(checkout, names)
"""


WARM_UP = REPO / "fixtures" / "examples" / "train.py"


def measure_repository(checkout: Path, names: list[str]) -> tuple[float, float]:
    """(bare parse CPU-s, cold check CPU-s) of one repository, in one warmed-up process."""
    done = subprocess.run([sys.executable, "-c", _REPOSITORY_PROGRAM, "both", str(WARM_UP), str(checkout), *names],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True, text=True)
    bare, check = map(float, done.stdout.split())
    return bare, check


def repository_instructions(work: str, checkout: Path, names: list[str], scratch: Path) -> int:
    """Instructions callgrind counts for ``_REPOSITORY_PROGRAM`` doing ``work`` on one repository."""
    counts = scratch / f"callgrind.{checkout.name}.{work}"
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={counts}", sys.executable, "-c",
         _REPOSITORY_PROGRAM, work, str(WARM_UP), str(checkout), *names],
        env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    summary = next(line for line in counts.read_text().splitlines() if line.startswith("summary:"))
    return int(summary.split()[1])


def training_corpus(root: Path, per_repo: int, rounds: int, sample: int | None) -> None:
    """``--corpus``: the CPU ratio of a cold check to a bare parse, per repository
    (median of ``rounds`` warmed-up processes), then the median and the total."""
    rows = []
    repositories = corpus_repositories(root, per_repo)
    for name, checkout, files in repositories:
        names = [str(path.relative_to(checkout)) for path in files]
        measured = [measure_repository(checkout, names) for _ in range(rounds)]
        ratio = statistics.median(check / bare for bare, check in measured)
        bare = statistics.median(bare for bare, _ in measured)
        lines = sum(path.read_text(encoding="utf-8", errors="replace").count("\n") for path in files)
        rows.append((name, len(files), lines, bare, bare * ratio, ratio))
        print(f"{name:32s} {len(files):5d} files {lines:8,d} lines  parse {bare:6.2f} CPU-s  check {bare * ratio:6.2f} CPU-s  "
              f"{ratio:5.2f}x", flush=True)
    total_bare, total_check = sum(r[3] for r in rows), sum(r[4] for r in rows)
    print(f"{len(rows)} repositories, {sum(r[1] for r in rows)} files: median {statistics.median(r[5] for r in rows):.2f}x, "
          f"total {total_check / total_bare:.2f}x (cold check CPU over bare parse CPU, in one warmed-up process per "
          f"repository, median of {rounds} round{'s' if rounds > 1 else ''}; target <= 1.3x)")
    if sample:
        picked = repositories[:: max(1, len(repositories) // sample)][:sample]
        with tempfile.TemporaryDirectory() as scratch:
            counted = []
            for name, checkout, files in picked:
                names = [str(path.relative_to(checkout)) for path in files]
                nothing, parse, check = (repository_instructions(work, checkout, names, Path(scratch))
                                         for work in ("nothing", "parse", "check"))
                counted.append((parse - nothing, check - nothing))
                print(f"instructions {name:32s} {len(files):4d} files  check / bare parse {(check - nothing) / (parse - nothing):.3f}x",
                      flush=True)
        print(f"instructions, {len(picked)} repositories: median {statistics.median(c / p for p, c in counted):.3f}x, "
              f"total {sum(c for _, c in counted) / sum(p for p, _ in counted):.3f}x (callgrind; target <= 1.3x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="how many source files (default 1000)")
    parser.add_argument("--package", default="torch", help="whose installed sources to check (default torch)")
    parser.add_argument("--jobs", type=int, help="worker processes of detaudit check (default: its own)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating bare-parse / cold-check rounds (default 1)")
    parser.add_argument("--instructions", type=int, metavar="N",
                        help="also count instructions (callgrind) of checking and parsing N sample files")
    parser.add_argument("--corpus", type=Path, metavar="DIR", help="measure the training corpus checked out under DIR instead")
    parser.add_argument("--per-repo", type=int, default=150, help="with --corpus: at most this many files per repository (default 150)")
    options = parser.parse_args()
    if options.corpus is not None:
        training_corpus(options.corpus, options.per_repo, options.rounds, options.instructions)
        return

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

        check = ["check", "src", "--format", "json", "--exit-zero"]
        if options.jobs is not None:
            check += ["--jobs", str(options.jobs)]
        rounds = []  # (bare parse CPU-s, cold check wall-s, cold check CPU-s)
        for _ in range(options.rounds):
            bare = bare_parse_cpu(texts)
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
