"""Run `detaudit run` on real public training scripts, unchanged, and score
each verdict against plain runs.

The corpus is data: bench/realcode/corpus.json names each script by
repository, commit and path (or a script written for the corpus where no
public one runs on a CPU-only, offline machine), with its tiny configuration,
the synthetic data it needs and the verdict plain runs gave. Public scripts
are read from a mirror made by the search tool's ``fetch``
(``--mirrors``, default /work/.mirror/OWNER+NAME/repo); an entry whose mirror
or package is missing is skipped and says so.

Per script: the plain-run truth (bench/realcode/plain_truth.py, ``--truth-runs``
runs without detaudit, each a digest of every parameter and optimizer state
after the same number of steps), detaudit's verdict, right/wrong, and the
cost: detaudit's wall time over the plain runs' (same number of runs).

    python bench/realcode_dynamic.py [--only NAME,NAME] [--quick] [--repeats 2]

Exit 1 when a verdict is wrong (a known limit is reported, not counted).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CORPUS = REPO_ROOT / "bench" / "realcode" / "corpus.json"
PLAIN_TRUTH = REPO_ROOT / "bench" / "realcode" / "plain_truth.py"
DEFAULT_MIRRORS = Path("/work/.mirror")
VERDICT_CLASS = {"deterministic": "deterministic", "latent": "deterministic", "nondeterministic": "nondeterministic"}


# --- synthetic data, written into the checkout before the script runs -------------------------


def _nanogpt_shakespeare_char(root: Path) -> None:
    import numpy

    folder = root / "data" / "shakespeare_char"
    folder.mkdir(parents=True, exist_ok=True)
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz .,\n"))
    tokens = numpy.random.default_rng(0).integers(0, len(chars), size=20_000).astype(numpy.uint16)
    tokens[:18_000].tofile(folder / "train.bin")
    tokens[18_000:].tofile(folder / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    (folder / "meta.pkl").write_bytes(pickle.dumps(meta))


def _words(count: int, seed: int) -> list[str]:
    import random

    chooser = random.Random(seed)
    return ["".join(chooser.choice("etaoinshrdlu") for _ in range(chooser.randint(2, 7))) for _ in range(count)]


def _chargpt_input(root: Path) -> None:
    # chargpt samples from the context "O God, O God!": its characters must be in the vocabulary
    (root / "projects" / "chargpt" / "input.txt").write_text("O God, O God! " + " ".join(_words(3000, 1)))


def _makemore_names(root: Path) -> None:
    (root / "names.txt").write_text("\n".join(_words(2000, 2)) + "\n")


def _wikitext_like(root: Path) -> None:
    folder = root / "word_language_model" / "synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 600), ("valid", 120), ("test", 120)):
        words = _words(count, len(split))
        lines = [" ".join(words[i : i + 12]) for i in range(0, count, 12)]
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")


def _sine_waves(root: Path) -> None:
    # generate_sine_wave.py's format (a float64 NumPy array through torch.save) at 8 x 60
    # instead of 100 x 1000: the LSTMCell loop runs per time step in Python
    import numpy
    import torch

    rng = numpy.random.default_rng(2)
    x = numpy.arange(60) + rng.integers(-80, 80, 8).reshape(8, 1)
    torch.save(numpy.sin(x / 20.0).astype("float64"), root / "time_sequence_prediction" / "traindata.pt")


DATA_MAKERS = {
    "sine_waves": _sine_waves,
    "nanogpt_shakespeare_char": _nanogpt_shakespeare_char,
    "chargpt_input": _chargpt_input,
    "makemore_names": _makemore_names,
    "wikitext_like": _wikitext_like,
}


# --- the corpus -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CorpusScript:
    name: str
    args: tuple[str, ...]
    steps: int
    expected: str
    repo: str | None = None
    commit: str | None = None
    path: str | None = None
    script: str | None = None
    cwd: str = "."
    tree: tuple[str, ...] = ()  # pathspecs of the repository to lay out (default: all of it)
    env: tuple[tuple[str, str], ...] = ()
    data: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    nproc: int = 0
    quick: bool = False
    known_limit: str | None = None  # why detaudit's verdict cannot be right yet (an open issue)
    report_says: str | None = None  # what its report must say all the same

    @classmethod
    def from_json(cls, entry: dict) -> "CorpusScript":
        fields = dict(entry)
        fields["args"] = tuple(fields.get("args", ()))
        fields["env"] = tuple(sorted(fields.get("env", {}).items()))
        fields["data"] = tuple(fields.get("data", ()))
        fields["requires"] = tuple(fields.get("requires", ()))
        fields["tree"] = tuple(fields.get("tree", ()))
        return cls(**fields)

    def missing(self, mirrors: Path) -> str | None:
        """Why this entry cannot run here, or None."""
        for package in self.requires:
            if importlib.util.find_spec(package) is None:
                return f"needs the {package} package"
        if self.repo and not self.mirror(mirrors).is_dir():
            return f"no mirror of {self.repo} under {mirrors}"
        return None

    def mirror(self, mirrors: Path) -> Path:
        return mirrors / self.repo.replace("/", "+") / "repo"

    def checkout(self, mirrors: Path, into: Path) -> Path:
        """Lay the script (and its repository at the pinned commit) into ``into``; return the
        path of the entry script there."""
        if self.repo:
            archive = subprocess.run(
                ["git", "--git-dir", str(self.mirror(mirrors)), "archive", self.commit, "--", *self.tree],
                check=True, capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
            entry = into / self.path
        else:
            entry = into / Path(self.script).name
            shutil.copy(REPO_ROOT / self.script, entry)
        for maker in self.data:
            DATA_MAKERS[maker](into)
        return entry


def load_corpus(path: Path = CORPUS) -> list[CorpusScript]:
    return [CorpusScript.from_json(entry) for entry in json.loads(path.read_text())["scripts"]]


# --- running ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    script: CorpusScript
    truth: str  # deterministic | nondeterministic | error: ...
    verdict: str  # detaudit's verdict, or error: ...
    plain_seconds: float
    detaudit_seconds: float
    report: dict | None

    @property
    def right(self) -> bool:
        return VERDICT_CLASS.get(self.verdict) == self.truth

    @property
    def status(self) -> str:
        says = self.script.report_says
        if says and says not in json.dumps(self.report):
            return "WRONG"  # the report must say it whatever the verdict
        if self.right:
            return "right"
        return "known limit" if self.script.known_limit else "WRONG"


def _launcher(script: CorpusScript) -> list[str]:
    if not script.nproc:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(script.nproc)]


def _environment(script: CorpusScript, root: Path) -> dict[str, str]:
    """The caller's environment and the entry's (``{root}``: the checkout)."""
    return {**os.environ, **{name: value.format(root=root) for name, value in script.env}}


def _run(command: list[str], cwd: Path, environment: dict, timeout: float, stderr=subprocess.STDOUT) -> tuple[int, str]:
    """Run until the process itself exits (its output goes to a file, not a pipe: a DataLoader
    worker or a compile worker that outlives it by a few seconds would hold a pipe open and
    count in its time); its exit code and output."""
    with tempfile.TemporaryFile("w+") as output:
        returncode = subprocess.run(command, cwd=cwd, env=environment, stdout=output, stderr=stderr,
                                    timeout=timeout).returncode
        output.seek(0)
        return returncode, output.read()


def plain_truth(script: CorpusScript, entry: Path, root: Path, runs: int, timeout: float) -> tuple[str, float]:
    """Digests of ``runs`` plain runs: the truth, and the mean seconds a run took."""
    cwd = root / script.cwd
    digests = []
    started = time.perf_counter()
    for run in range(runs):
        out = cwd / f".truth-{run}"
        command = [*_launcher(script), str(PLAIN_TRUTH), "--steps", str(script.steps or 10**9),
                   "--out", str(out), str(entry), *script.args]
        try:
            returncode, output = _run(command, cwd, _environment(script, root), timeout)
        except subprocess.TimeoutExpired:
            return f"error: a plain run took over {timeout:.0f} s", 0.0
        files = sorted(cwd.glob(f".truth-{run}*"))
        if returncode != 0 or not files:
            tail = output.strip().splitlines()[-3:]
            return "error: plain run exited with %d: %s" % (returncode, " | ".join(tail)), 0.0
        digests.append(tuple(path.read_text() for path in files))
    seconds = (time.perf_counter() - started) / runs
    return ("deterministic" if len(set(digests)) == 1 else "nondeterministic"), seconds


def detaudit_verdict(script: CorpusScript, entry: Path, root: Path, repeats: int, timeout: float):
    command = [sys.executable, "-m", "detaudit", "run", str(entry), "--steps", str(script.steps),
               "--repeats", str(repeats), "--format", "json", "--timeout", str(timeout)]
    if script.nproc:
        command += ["--nproc-per-node", str(script.nproc)]
    command += ["--", *script.args]
    started = time.perf_counter()
    try:
        returncode, output = _run(command, root / script.cwd, _environment(script, root), timeout * repeats * 2 + 120,
                                  stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "error: detaudit did not end", time.perf_counter() - started, None
    seconds = time.perf_counter() - started
    try:
        report = json.loads(output)
    except json.JSONDecodeError:
        return f"error: exit {returncode}: {output.strip().splitlines()[-1:]}", seconds, None
    return report.get("verdict", f"error: {report.get('error')}"), seconds, report


def audit(script: CorpusScript, mirrors: Path, repeats: int, truth_runs: int, timeout: float, keep: bool = False) -> Outcome:
    folder = Path(tempfile.mkdtemp(prefix=f"realcode-{script.name}-"))
    try:
        entry = script.checkout(mirrors, folder)
        truth, plain_seconds = plain_truth(script, entry, folder, truth_runs, timeout)
        verdict, detaudit_seconds, report = detaudit_verdict(script, entry, folder, repeats, timeout)
        return Outcome(script, truth, verdict, plain_seconds * repeats, detaudit_seconds, report)
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated names")
    parser.add_argument("--quick", action="store_true", help="only the entries the test suite runs")
    parser.add_argument("--repeats", type=int, default=2, help="detaudit runs per script (default 2)")
    parser.add_argument("--truth-runs", type=int, default=3, help="plain runs per script (default 3)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--mirrors", type=Path, default=DEFAULT_MIRRORS)
    parser.add_argument("--keep", action="store_true", help="keep each checkout (its path is printed)")
    options = parser.parse_args(argv)
    wanted = set(options.only.split(",")) if options.only else None
    wrong = 0
    print(f"{'script':32} {'plain runs':16} {'detaudit':16} {'':11} traced/plain")
    for script in load_corpus():
        if (wanted and script.name not in wanted) or (options.quick and not script.quick):
            continue
        missing = script.missing(options.mirrors)
        if missing:
            print(f"{script.name:32} skipped: {missing}")
            continue
        outcome = audit(script, options.mirrors, options.repeats, options.truth_runs, options.timeout, options.keep)
        ratio = outcome.detaudit_seconds / outcome.plain_seconds if outcome.plain_seconds else float("nan")
        print(f"{script.name:32} {outcome.truth[:16]:16} {outcome.verdict[:16]:16} {outcome.status:11} {ratio:6.1f}x"
              f"  ({outcome.detaudit_seconds:.1f} s / {outcome.plain_seconds:.1f} s)", flush=True)
        if outcome.truth != script.expected:
            print(f"    plain runs gave {outcome.truth}, the corpus expects {script.expected}")
        if outcome.status == "known limit":
            print(f"    known limit: {script.known_limit}")
        if outcome.status == "WRONG" or outcome.truth.startswith("error"):
            wrong += 1
            if outcome.verdict.startswith("error"):
                print(f"    {outcome.verdict}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
