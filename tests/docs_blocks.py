"""The docs (README.md and docs/**/*.md) and their fenced blocks, for the docs tests.

A block may carry a directive: an HTML comment (which renders as nothing) on the
line right before its opening fence::

    <!-- docs-test: OPTION; OPTION: VALUE -->

Options are separated by ``;`` (so a value holds none).  Options of a ```console
block (tests/test_docs_examples.py says what each does): ``slow``, ``stderr``,
``setup: COMMAND``, ``numbers vary: REASON``, ``skip: REASON``.  Option of a
```python block: ``file: PATH``, the block is that file's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DIRECTIVE = re.compile(r"<!-- docs-test: (.*) -->")
OPTIONS = {
    "console": {"slow", "stderr", "setup", "numbers vary", "skip"},
    "python": {"file"},
}
#: options that must say why (a loosened or skipped example states its reason)
NEEDS_VALUE = {"setup", "numbers vary", "skip", "file"}


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str  # between the fences, ending with a newline
    options: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return where(self.path, self.line)


def _options(directive: str, lang: str, location: str) -> dict[str, str]:
    options = {}
    for part in directive.split(";"):
        name, _, value = (piece.strip() for piece in part.partition(":"))
        if name not in OPTIONS.get(lang, ()):
            raise ValueError(f"{location}: unknown docs-test option {name!r} for a {lang or 'plain'} block")
        if (name in NEEDS_VALUE) != bool(value):
            raise ValueError(f"{location}: docs-test option {name!r} {'needs' if name in NEEDS_VALUE else 'takes no'} value")
        options[name] = value
    return options


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file (fences at the start of a line)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, index = [], 0
    while index < len(lines):
        if not lines[index].startswith("```"):
            index += 1
            continue
        lang, start = lines[index][3:].strip(), index
        end = next((i for i in range(start + 1, len(lines)) if lines[i] == "```"), None)
        if end is None:
            raise ValueError(f"{where(path, start + 1)}: a fence that never closes")
        directive = DIRECTIVE.fullmatch(lines[start - 1].strip()) if start else None
        location = where(path, start + 1)
        options = _options(directive.group(1), lang, location) if directive else {}
        text = "".join(line + "\n" for line in lines[start + 1 : end])
        found.append(Block(path, start + 1, lang, text, options))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]
