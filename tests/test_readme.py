"""The README stays a front page: short, and its test command is what CI runs.
(The rules table it once held is docs/rules/README.md, checked by tests/test_docs.py.)"""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_test_command_is_what_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in README.read_text(encoding="utf-8")


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move the detail to a page under docs/ (200 at most)"
