"""The README's rules table is generated from the rule registry; keep them in sync."""

from __future__ import annotations

import re
from pathlib import Path

from detaudit.cli.rules import rules_table_markdown

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"<!-- rules-table:start -->\n(.*?)<!-- rules-table:end -->", re.S)


def test_rules_table_matches_the_registry():
    match = BLOCK.search(README.read_text(encoding="utf-8"))
    assert match, "README.md lost its rules-table markers"
    assert match.group(1) == rules_table_markdown(), (
        "README rules table is stale: replace the block with `detaudit rules --format markdown`"
    )


def test_readme_test_command_is_what_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in README.read_text(encoding="utf-8")
