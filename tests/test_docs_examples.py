"""Every ```console example in README.md and docs/ is run, and what it shows is
compared with what the tool prints now.

How an example runs.  The block's ``$ `` lines are its commands; every other line
is output.  The commands run in order in one bash process (so ``echo $?`` reports
the command before it), in a fresh temporary folder holding a copy of the
repository's ``fixtures/`` and ``pyproject.toml``: paths read as from the
repository root, and commands that write (``--fix``, ``--out``) leave the
checkout alone.  ``detaudit``, ``python`` and ``pytest`` are this interpreter's,
running this checkout's code.  The environment is a fresh shell's: the variables
detaudit reports or obeys (``PYTHONHASHSEED``, thread counts, ``DETAUDIT_*``) and
those that size or colour rich's output (``COLUMNS``, ``FORCE_COLOR``) are unset.
The transcript (each command as ``$ COMMAND``, then its stdout) must match the
block.  Directive options (``<!-- docs-test: ... -->`` before the fence, see
tests/docs_blocks.py):

- ``stderr``: stderr is part of the transcript too, interleaved with stdout as on
  a terminal (``PYTHONUNBUFFERED``); without it stderr is only shown on failure.
- ``setup: COMMAND``: a shell command run first and not shown.
- ``slow``: the example is marked ``@pytest.mark.slow`` (it runs training subprocesses).
- ``skip: REASON``: not run; the reason says why (a measurement, a GPU).

What is normalised, on both sides, and why (nothing else is):

1. trailing whitespace on each line and blank lines at the end: rich pads a
   table's title to the table's width, and Markdown keeps no trailing spaces;
2. the elapsed time in ``detaudit check``'s summary ("Checked 1 file in 0.04s"):
   it measures the machine, not the tool;
3. with ``numbers vary: REASON`` only: every number that is not part of a name or
   a ``path:line``, nor a line of its own (what ``echo $?`` prints), reads as 0,
   and runs of spaces, or of one box-drawing character, as one: for a race, a
   timing or an unseeded draw, whose figures change on every run and widen a
   table's columns.  The words must still match.

How the shown output matches.  Without ``...`` it must equal the transcript.
With it, each ``...`` stands for any text, also none and across lines (doctest's
ELLIPSIS): the pieces between must appear in the transcript in order, the first
at its very start and the last at its very end.  Abbreviated examples use it
for what varies by machine (versions, CPU kernels, paths) or is too long to show.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docs_blocks import REPO, Block, all_blocks

TIMEOUT_S = 300
UNSET = {
    "COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "PYTHONHASHSEED",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "NCCL_ALGO", "NCCL_PROTO",
}
KEPT_DETAUDIT = {"DETAUDIT_NATIVE_CACHE"}  # where the compiled recorder is built: the build is not what is shown
CHECK_ELAPSED = re.compile(r"^(Checked \d+ files? in )\d+\.\d+s", re.M)
NUMBER = re.compile(r"(?<![\w.:/])[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?%?")
BOX_RUN = re.compile(r"([─━═])\1+")


def _console_blocks() -> list[Block]:
    unique: dict[tuple, Block] = {}  # one run for an example shown on two pages
    for block in all_blocks():
        if block.lang == "console":
            unique.setdefault((block.text, tuple(sorted(block.options.items()))), block)
    return list(unique.values())


def _params():
    for block in _console_blocks():
        marks = [pytest.mark.slow] if "slow" in block.options else []
        if "skip" in block.options:
            marks.append(pytest.mark.skip(reason=block.options["skip"]))
        yield pytest.param(block, marks=marks, id=block.where)


def normalise(text: str, numbers_vary: bool) -> str:
    text = "\n".join(line.rstrip() for line in text.splitlines()).rstrip("\n")
    text = CHECK_ELAPSED.sub(r"\g<1>0.00s", text)
    if numbers_vary:
        text = "\n".join(line if line.isdigit() else BOX_RUN.sub(r"\1", re.sub(r" +", " ", NUMBER.sub("0", line)))
                         for line in text.split("\n"))
    return text


def matches(shown: str, actual: str) -> bool:
    """doctest's ELLIPSIS: each ``...`` in ``shown`` stands for any text."""
    pieces = shown.split("...")
    if len(pieces) == 1:
        return shown == actual
    first, *middle, last = pieces
    if not (actual.startswith(first) and actual.endswith(last) and len(first) + len(last) <= len(actual)):
        return False
    position, end = len(first), len(actual) - len(last)
    for piece in middle:
        position = actual.find(piece, position, end)
        if position < 0:
            return False
        position += len(piece)
    return True


def _environment() -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in UNSET and (not name.startswith("DETAUDIT_") or name in KEPT_DETAUDIT)
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _script(block: Block) -> str:
    lines = ["exec 2>&1" if "stderr" in block.options else 'exec 2>>"$DOCS_EXAMPLE_STDERR"']
    if "setup" in block.options:
        lines.append(f"{{ {block.options['setup']}\n}} >/dev/null || exit 97")
    for line in block.text.splitlines():
        if line.startswith("$ "):  # echo the command, keeping $? for an `echo $?` after it
            lines += ["status=$?", f"printf '%s\\n' {shlex.quote(line)}", "(exit $status)", line[2:]]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("block", list(_params()))
def test_console_example(block: Block, tmp_path):
    assert block.text.startswith("$ "), f"{block.where}: a console example starts with a `$ ` command"
    shutil.copytree(REPO / "fixtures", tmp_path / "fixtures", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    stderr = tmp_path.parent / f"{tmp_path.name}.stderr"
    env = _environment() | {"DOCS_EXAMPLE_STDERR": str(stderr)}
    done = subprocess.run(
        ["bash", "-c", _script(block)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode != 97, f"{block.where}: its setup failed:\n{done.stdout}"
    numbers_vary = "numbers vary" in block.options
    shown, actual = normalise(block.text, numbers_vary), normalise(done.stdout, numbers_vary)
    if matches(shown, actual):
        return
    diff = "\n".join(difflib.unified_diff(shown.splitlines(), actual.splitlines(), "shown", "printed now", lineterm=""))
    pytest.fail(
        f"{block.where}: the example no longer shows what its commands print: update the block "
        f"(or mark with `...` what legitimately varies)\n{diff}\n\n--- printed now ---\n{done.stdout}"
        + (f"\n--- stderr ---\n{stderr.read_text()}" if stderr.exists() else ""),
        pytrace=False,
    )


def test_every_example_is_a_console_block():
    # an example that shows a command in a plain or text block would escape the test above
    for block in all_blocks():
        if block.lang in ("", "text", "shell", "bash", "sh") and block.text.startswith("$ "):
            pytest.fail(f"{block.where}: a command with its output belongs in a ```console block")


def test_python_blocks_that_name_a_file_are_its_text():
    for block in all_blocks():
        if "file" in block.options:
            path = REPO / block.options["file"]
            assert path.is_file(), f"{block.where}: {block.options['file']} does not exist"
            assert block.text == path.read_text(encoding="utf-8"), (
                f"{block.where}: the block is no longer the text of {block.options['file']}: paste the file in"
            )


def test_the_matching_rules():
    # `...` stands for any text, across lines; the rest must appear in order, anchored at both ends
    assert matches("a\n...\nd", "a\nb\nc\nd") and matches("a ... d", "a bc d") and matches("a...", "a")
    assert not matches("a\n...\nd", "x\na\nd") and not matches("ab...ba", "aba") and not matches("a...b...c", "acb")
    assert not matches("exact", "exact ")
    # numbers vary: figures and column widths may move, names, path:line and exit codes may not
    assert normalise("│ 0.00262    │ 2/2 pairs │\n1", True) == normalise("│ 0.0017 │ 1/2 pairs │\n1", True)
    assert normalise("train.py:17 rank0/model.1", True) == "train.py:17 rank0/model.1"
    assert normalise("$ echo $?\n1", True) != normalise("$ echo $?\n0", True)
    assert normalise("Checked 1 file in 0.45s: no findings.  \n\n", False) == "Checked 1 file in 0.00s: no findings."
